//! Kernel throughput: the CPU cost of the queue state machine alone, without I/O.
//! `cargo bench -p ferry-kernel` (figures in docs/benchmarks.md).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ferry_kernel::{
    Caller, NewMessage, PropertyValue, Queue, QueueConfig, QueueName, QueueUid, ReceiveOutcome,
    ReceiveRequest, Selector, SelectorLimits, SessionId, Wait,
};

const BATCH: u64 = 1_000;

fn queue() -> Queue {
    let config = QueueConfig {
        receive_batch_max: 1_000,
        ..QueueConfig::default()
    };
    Queue::new(
        QueueName::new("bench").expect("valid name"),
        QueueUid(1),
        config,
    )
}

fn message(i: u64) -> NewMessage {
    let mut m = NewMessage {
        body: vec![0u8; 1024],
        persistent: true,
        ..NewMessage::default()
    };
    m.properties
        .insert("n".into(), PropertyValue::Long(i as i64));
    m
}

fn receive(max: u32, selector: Option<Arc<Selector>>) -> ReceiveRequest {
    ReceiveRequest {
        owner: Some(SessionId(1)),
        max_messages: max,
        wait: Wait::NoWait,
        lease_ms: None,
        selector,
    }
}

/// Send a batch, receive it, acknowledge it: one full message life per element.
fn send_receive_ack(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernel");
    g.throughput(Throughput::Elements(BATCH));
    g.bench_function("send+receive+ack 1 KiB, batches of 1000", |b| {
        b.iter_batched(
            || (queue(), (0..BATCH).map(message).collect::<Vec<_>>()),
            |(mut q, msgs)| {
                let (_, fx) = q.send(msgs, 1_000).expect("send");
                let _ = black_box(fx);
                let (out, _) = q.receive(receive(1_000, None), 1_000).expect("receive");
                let ReceiveOutcome::Delivered(d) = out else {
                    panic!("nothing delivered")
                };
                let leases: Vec<_> = d.iter().map(|d| d.lease_ref()).collect();
                let _ = black_box(q.ack(Caller::Backend, &leases, 1_001));
                q
            },
            BatchSize::SmallInput,
        );
    });
    let sel = Arc::new(
        Selector::parse("n > 500 AND n < 600", &SelectorLimits::default()).expect("selector"),
    );
    g.bench_function("selective receive of 100 among 1000 ready", |b| {
        b.iter_batched(
            || {
                let mut q = queue();
                let _ = q
                    .send((0..BATCH).map(message).collect(), 1_000)
                    .expect("send");
                q
            },
            |mut q| {
                let out = q
                    .receive(receive(1_000, Some(sel.clone())), 1_000)
                    .expect("receive");
                // Returned, so dropping the queue happens outside the measurement.
                (q, black_box(out))
            },
            BatchSize::SmallInput,
        );
    });
    g.finish();
}

criterion_group!(benches, send_receive_ack);
criterion_main!(benches);
