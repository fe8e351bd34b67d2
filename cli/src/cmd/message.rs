//! `ferry message`: one message at a time.

use anyhow::Context as _;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::Format;

#[derive(Debug, clap::Subcommand)]
pub enum MessageCommand {
    /// Delete one message by its id (refused while a consumer holds it).
    Delete {
        #[arg(long, short)]
        queue: String,
        /// The id `ferry send` printed (ID:...).
        message_id: String,
    },
}

pub async fn run(c: &ClientArgs, cmd: MessageCommand) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    match cmd {
        MessageCommand::Delete { queue, message_id } => {
            admin
                .delete_message(pb::DeleteMessageRequest {
                    queue: queue.clone(),
                    message_id: message_id.clone(),
                })
                .await
                .with_context(|| format!("cannot delete {message_id} from {queue}"))?;
            match c.output {
                Format::Json => println!("{}", json!({ "queue": queue, "deleted": message_id })),
                Format::Human => println!("deleted {message_id} from {queue}"),
            }
        }
    }
    Ok(())
}
