//! `publish`: one message to a topic, from the terminal or a script.

use std::io::{IsTerminal, Read};
use std::process::ExitCode;

use crate::config::Config;
use anyhow::Context;
use clap::Args;
use wharf::domain::{TopicName, ValidationError};
use wharf::queue::{Headers, OutgoingMessage};
use wharf::Wharf;

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The topic to publish to (e.g. orders).
    #[arg(long)]
    pub topic: String,
    /// The message's subject: an MQTT topic name without wildcards (e.g. orders/eu/paid).
    #[arg(long)]
    pub subject: String,
    /// A header as NAME=VALUE; repeat the flag for more.
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = parse_header)]
    pub headers: Vec<(String, String)>,
    /// The payload as given; `-`, or nothing with stdin not a terminal, reads it from stdin.
    #[arg(value_name = "PAYLOAD")]
    pub payload: Option<String>,
}

/// `NAME=VALUE`, split at the first `=`; the error names the accepted form.
fn parse_header(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_owned(), value.to_owned())),
        _ => Err("expected NAME=VALUE, e.g. --header source=cli (the value may be empty)".into()),
    }
}

/// Renames a validation error's field to the flag the value came from.
fn as_flag(flag: &str, e: ValidationError) -> ValidationError {
    ValidationError {
        field: flag.to_owned(),
        ..e
    }
}

/// The message the arguments describe, validated before the store is opened.
fn message(args: &PublishArgs) -> anyhow::Result<(TopicName, OutgoingMessage)> {
    let topic = TopicName::parse("--topic", &args.topic)?;
    let mut headers = Headers::new();
    for (name, value) in &args.headers {
        if headers.insert(name.clone(), value.clone()).is_some() {
            anyhow::bail!("invalid --header: {name:?} is given more than once");
        }
    }
    let payload = payload(args.payload.as_deref())?;
    let message = OutgoingMessage::new(&args.subject, payload, headers).map_err(|e| {
        let flag = match e.field.as_str() {
            "subject" => "--subject",
            "payload" => "PAYLOAD",
            _ => "--header",
        };
        as_flag(flag, e)
    })?;
    Ok((topic, message))
}

/// The payload argument, or stdin for `-` (or no argument when stdin is not a terminal).
fn payload(given: Option<&str>) -> anyhow::Result<Vec<u8>> {
    match given {
        Some("-") => read_stdin(),
        Some(text) => Ok(text.as_bytes().to_vec()),
        None if !std::io::stdin().is_terminal() => read_stdin(),
        None => anyhow::bail!(
            "no payload: give it as an argument (\"\" for an empty one), or pipe it in with `-`"
        ),
    }
}

fn read_stdin() -> anyhow::Result<Vec<u8>> {
    let mut payload = Vec::new();
    std::io::stdin()
        .read_to_end(&mut payload)
        .context("reading the payload from stdin")?;
    Ok(payload)
}

/// Publishes one message to an existing, migrated store and prints its position.
pub async fn run(config: &Config, args: PublishArgs) -> anyhow::Result<ExitCode> {
    let (topic, message) = message(&args)?;
    let store = wharf::open_existing_store(&config.store).await?;
    store.ensure_migrated().await?;
    let wharf = Wharf::with_store(store, &config.settings());
    let position = wharf.queue().publish_one(&topic, message).await?;
    println!("{position}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_are_name_equals_value() {
        assert_eq!(parse_header("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert_eq!(parse_header("a="), Ok(("a".into(), String::new())));
        assert!(parse_header("novalue").unwrap_err().contains("NAME=VALUE"));
        assert!(parse_header("=v").is_err());
    }
}
