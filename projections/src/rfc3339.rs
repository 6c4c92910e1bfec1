//! Timestamps in the listing's and the history's JSON, written as chrono writes them (RFC 3339, UTC as `Z`, the
//! fraction in 0, 3, 6 or 9 digits, whichever holds it exactly) but without the formatting
//! machinery: chrono's own serializer writes a timestamp as a dozen small pieces through
//! `Display`, each escaped on its way into the JSON, about 8% of the listing API's CPU on a
//! page of 100 groups (ADR 0070). Here the text is built in a buffer on the stack and handed
//! to the serializer whole. A year outside 0..=9999 or a leap second goes to chrono's own.

use chrono::{DateTime, Datelike, Timelike, Utc};
use serde::{Serialize, Serializer};

/// The longest text written here: `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`.
const LONGEST: usize = 30;

/// Serializes `at` as chrono's `Serialize` does; for `#[serde(serialize_with)]`.
pub fn serialize<S: Serializer>(at: &DateTime<Utc>, serializer: S) -> Result<S::Ok, S::Error> {
    let mut text = [0u8; LONGEST];
    match write(at, &mut text) {
        Some(len) => serializer.serialize_str(ascii(&text[..len])),
        None => at.serialize(serializer),
    }
}

/// The buffer's text; only ASCII digits and punctuation are ever written to it.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Writes `value` as `out.len()` decimal digits, zero-padded.
fn digits(out: &mut [u8], mut value: u32) {
    for slot in out.iter_mut().rev() {
        *slot = b'0' + (value % 10) as u8;
        value /= 10;
    }
}

/// Writes `at` into `out`; its length, or `None` when chrono's own form differs from the
/// plain one (a year outside 0..=9999, a leap second).
fn write(at: &DateTime<Utc>, out: &mut [u8; LONGEST]) -> Option<usize> {
    let year = u32::try_from(at.year()).ok().filter(|y| *y <= 9999)?;
    let nanos = at.nanosecond();
    if nanos >= 1_000_000_000 {
        return None;
    }
    digits(&mut out[0..4], year);
    out[4] = b'-';
    digits(&mut out[5..7], at.month());
    out[7] = b'-';
    digits(&mut out[8..10], at.day());
    out[10] = b'T';
    digits(&mut out[11..13], at.hour());
    out[13] = b':';
    digits(&mut out[14..16], at.minute());
    out[16] = b':';
    digits(&mut out[17..19], at.second());
    let (fraction, width) = match nanos {
        0 => (0, 0),
        n if n % 1_000_000 == 0 => (n / 1_000_000, 3),
        n if n % 1_000 == 0 => (n / 1_000, 6),
        n => (n, 9),
    };
    let mut len = 19;
    if width > 0 {
        out[19] = b'.';
        digits(&mut out[20..20 + width], fraction);
        len = 20 + width;
    }
    out[len] = b'Z';
    Some(len + 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[derive(Serialize)]
    struct Ours(#[serde(serialize_with = "serialize")] DateTime<Utc>);

    fn both(at: DateTime<Utc>) -> (String, String) {
        (
            serde_json::to_string(&Ours(at)).unwrap(),
            serde_json::to_string(&at).unwrap(),
        )
    }

    #[test]
    fn every_fraction_width_matches_chrono() {
        let base = Utc.with_ymd_and_hms(2026, 12, 5, 13, 4, 9).unwrap();
        for nanos in [
            0,
            1,
            999,
            1_000,
            123_000,
            1_000_000,
            120_000_000,
            123_456_000,
            123_456_789,
            999_999_999,
        ] {
            let at = base + chrono::Duration::nanoseconds(nanos);
            let (ours, chrono) = both(at);
            assert_eq!(ours, chrono, "{nanos} ns");
        }
    }

    #[test]
    fn dates_across_the_calendar_match_chrono() {
        // A walk over four centuries in steps that land on every month, day and time of day.
        let mut at = Utc.with_ymd_and_hms(1900, 1, 1, 0, 0, 0).unwrap();
        let end = Utc.with_ymd_and_hms(2300, 1, 1, 0, 0, 0).unwrap();
        let step =
            chrono::Duration::seconds(86_400 * 3 + 3_661) + chrono::Duration::microseconds(7);
        let mut checked = 0;
        while at < end {
            let (ours, chrono) = both(at);
            assert_eq!(ours, chrono);
            at += step;
            checked += 1;
        }
        assert!(checked > 40_000, "{checked}");
    }

    #[test]
    fn the_edges_of_the_plain_form_match_chrono() {
        for at in [
            DateTime::<Utc>::UNIX_EPOCH,
            Utc.with_ymd_and_hms(0, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(9999, 12, 31, 23, 59, 59).unwrap(),
            Utc.with_ymd_and_hms(10000, 1, 1, 0, 0, 0).unwrap(),
            Utc.with_ymd_and_hms(-1, 6, 1, 12, 0, 0).unwrap(),
        ] {
            let (ours, chrono) = both(at);
            assert_eq!(ours, chrono);
        }
    }

    #[test]
    fn a_leap_second_is_written_by_chrono() {
        let at = chrono::NaiveDate::from_ymd_opt(2016, 12, 31)
            .unwrap()
            .and_hms_nano_opt(23, 59, 59, 1_500_000_000)
            .unwrap()
            .and_utc();
        let (ours, chrono) = both(at);
        assert_eq!(ours, chrono);
        assert!(ours.contains(":60"), "{ours}");
    }
}
