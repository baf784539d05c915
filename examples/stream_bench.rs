//! The baseline of `scripts/bench-streams`: a minimal JetStream client loop (async-nats, the
//! same client the `nats` sink uses) publishing a file's lines as fast as it can, in batches
//! whose acknowledgements are awaited, each with a `Nats-Msg-Id`; and a stream's count. The
//! `nats bench` tool is not packaged for Debian, so this stands in for "the server's own tool".
//!
//! Run:  cargo run --example stream_bench -- publish URL SUBJECT FILE [BATCH]
//!       cargo run --example stream_bench -- count URL STREAM
//! `publish` prints `MESSAGES SECONDS`; `count` prints the stream's message count.

use std::time::Instant;

use anyhow::{Context, bail};
use async_nats::HeaderMap;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["publish", url, subject, file, ref rest @ ..] => {
                let batch: usize = rest.first().map_or(Ok(256), |b| b.parse())?;
                let lines: Vec<String> = std::fs::read_to_string(file)
                    .with_context(|| file.to_owned())?
                    .lines()
                    .map(str::to_owned)
                    .collect();
                let js = async_nats::jetstream::new(async_nats::connect(url).await?);
                let start = Instant::now();
                for (n, chunk) in lines.chunks(batch).enumerate() {
                    let mut acks = Vec::with_capacity(chunk.len());
                    for (i, line) in chunk.iter().enumerate() {
                        let mut headers = HeaderMap::new();
                        headers.insert("Nats-Msg-Id", format!("bench-{}", n * batch + i).as_str());
                        let body = bytes::Bytes::from(line.clone().into_bytes());
                        acks.push(
                            js.publish_with_headers(subject.to_owned(), headers, body)
                                .await?,
                        );
                    }
                    for ack in acks {
                        ack.await?;
                    }
                }
                println!("{} {:.3}", lines.len(), start.elapsed().as_secs_f64());
            }
            ["count", url, stream] => {
                let js = async_nats::jetstream::new(async_nats::connect(url).await?);
                let mut s = js.get_stream(stream).await?;
                println!("{}", s.info().await?.state.messages);
            }
            _ => bail!("usage: publish URL SUBJECT FILE [BATCH] | count URL STREAM"),
        }
        Ok(())
    })
}
