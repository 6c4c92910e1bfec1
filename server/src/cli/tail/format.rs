//! How `tail` prints a message: one line of text, or one JSON object per line.

use chrono::SecondsFormat;
use serde_json::{json, Value};
use wharf::queue::Claimed;

/// `POSITION SUBJECT PAYLOAD` (the payload as UTF-8, invalid bytes replaced by U+FFFD, control
/// characters escaped so a message is always one line), then `  [NAME=VALUE ...]` when the
/// message has headers.
pub fn text(message: &Claimed) -> String {
    let mut line = format!(
        "{} {} {}",
        message.position,
        message.subject,
        one_line(&String::from_utf8_lossy(&message.payload))
    );
    if !message.headers.is_empty() {
        let headers: Vec<String> = message
            .headers
            .iter()
            .map(|(name, value)| format!("{}={}", one_line(name), one_line(value)))
            .collect();
        line.push_str(&format!("  [{}]", headers.join(" ")));
    }
    line
}

/// One JSON object: `position`, `topic`, `subject`, `headers`, the payload as `payload` (a
/// string) when it is valid UTF-8 or else as `payload_base64` (standard alphabet, padded;
/// exactly one of the two is present), `published_at` (RFC 3339, UTC), `routed_by` (the install
/// whose set routed it) and `attempts` (claims so far, this one included).
pub fn json(message: &Claimed) -> String {
    let mut object = json!({
        "position": message.position,
        "topic": message.topic,
        "subject": message.subject,
        "headers": message.headers,
        "published_at": message.published_at.to_rfc3339_opts(SecondsFormat::Micros, true),
        "routed_by": message.routed_by,
        "attempts": message.attempts,
    });
    let payload = match std::str::from_utf8(&message.payload) {
        Ok(text) => ("payload", Value::from(text)),
        Err(_) => ("payload_base64", Value::from(base64(&message.payload))),
    };
    if let Value::Object(map) = &mut object {
        map.insert(payload.0.to_owned(), payload.1);
    }
    object.to_string()
}

/// Escapes control characters (newlines included) so the text stays on one line.
fn one_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
            c => out.push(c),
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648 section 4).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;
    use wharf::queue::Headers;

    fn claimed(payload: &[u8], headers: Headers) -> Claimed {
        Claimed {
            group: "g".into(),
            topic: "orders".into(),
            position: 7,
            subject: "orders/eu/paid".into(),
            payload: payload.to_vec(),
            headers,
            published_at: Utc::now(),
            attempts: 1,
            routed_by: 3,
            claim_token: 1,
        }
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        for (input, expected) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(input.as_bytes()), expected, "{input:?}");
        }
    }

    #[test]
    fn text_is_one_line_with_headers_last() {
        let headers = Headers::from([("k".to_owned(), "v".to_owned())]);
        assert_eq!(
            text(&claimed(b"a\nb", headers)),
            "7 orders/eu/paid a\\nb  [k=v]"
        );
        assert_eq!(text(&claimed(b"{}", Headers::new())), "7 orders/eu/paid {}");
    }

    #[test]
    fn json_carries_text_or_base64() {
        let parsed: Value = serde_json::from_str(&json(&claimed(b"hi", Headers::new()))).unwrap();
        assert_eq!(parsed["payload"], "hi");
        assert!(parsed.get("payload_base64").is_none());
        assert_eq!(parsed["routed_by"], 3);
        let parsed: Value =
            serde_json::from_str(&json(&claimed(&[0xff, 0], Headers::new()))).unwrap();
        assert_eq!(parsed["payload_base64"], "/wA=");
        assert!(parsed.get("payload").is_none());
    }
}
