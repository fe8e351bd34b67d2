use anyhow::Context as _;
use ferry_proto::pb;

use super::{connect, ClientArgs};
use crate::output::{errln, message_json, message_text, outln, BodyArgs, Format};

#[derive(Debug, clap::Args)]
pub struct BrowseArgs {
    /// The queue to look at.
    #[arg(long, short)]
    queue: String,
    /// At most this many messages (`--max` is an older name for it).
    #[arg(long, alias = "max", default_value_t = 100)]
    count: u64,
    #[command(flatten)]
    body: BodyArgs,
}

pub async fn run(c: &ClientArgs, a: BrowseArgs) -> anyhow::Result<()> {
    let mut m = connect(c).await?.messaging();
    let mut shown = 0u64;
    let mut page_token = String::new();
    while shown < a.count {
        let req = pb::BrowseRequest {
            queue: a.queue.clone(),
            selector: String::new(),
            max_messages: u32::try_from((a.count - shown).min(1_000)).unwrap_or(1_000),
            page_token: page_token.clone(),
        };
        let r = m
            .browse(req)
            .await
            .map_err(ferry_client::ClientError::from)
            .with_context(|| format!("cannot browse queue {}", a.queue))?
            .into_inner();
        for b in &r.messages {
            let msg = b.message.clone().unwrap_or_default();
            let state = pb::MessageState::try_from(b.state).map_or("unknown", |s| s.as_str_name());
            match c.output {
                Format::Json => {
                    let mut v = message_json(&msg, None, a.body.body_as);
                    v["state"] = state
                        .trim_start_matches("MESSAGE_STATE_")
                        .to_lowercase()
                        .into();
                    v["delivery_count"] = b.delivery_count.into();
                    outln!("{v}")?;
                }
                Format::Human => outln!(
                    "{}  [{}]",
                    message_text(&msg, None, a.body.body_as),
                    state.trim_start_matches("MESSAGE_STATE_").to_lowercase()
                )?,
            }
        }
        shown += r.messages.len() as u64;
        if r.next_page_token.is_empty() {
            break;
        }
        page_token = r.next_page_token;
    }
    // Say so, rather than print nothing at all; JSON output stays one object per message.
    if shown == 0 && c.output == Format::Human {
        errln!("no messages in queue {}", a.queue);
    }
    Ok(())
}
