//! A strict parser of the Prometheus text exposition format 0.0.4, for tests that scrape
//! `/metrics`.
//!
//! Strict where a lenient parser would hide an encoding bug: every line must be a comment,
//! blank, or a well-formed sample; a sample must follow its family's `# TYPE` line (families
//! are contiguous, one `TYPE` and at most one `HELP` each); names and label names must be
//! valid; label values must be quoted with only the format's escapes; no series may repeat;
//! the text must end with a newline.

use std::collections::{BTreeMap, BTreeSet};

/// A metric family: its type, help and samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Family {
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
    /// The `# HELP` text (unescaped), if any.
    pub help: Option<String>,
    /// Its samples, in order.
    pub samples: Vec<Sample>,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (the family's, or with `_bucket`/`_sum`/`_count`).
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A parsed scrape: families by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// Every family, by name.
    pub families: BTreeMap<String, Family>,
}

impl Scrape {
    /// The value of the sample `name` whose labels are exactly `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        self.families
            .values()
            .flat_map(|f| f.samples.iter())
            .find(|s| s.name == name && s.labels == wanted)
            .map(|s| s.value)
    }

    /// Like [`value`](Self::value), failing the test with the whole scrape when absent.
    pub fn expect(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels).unwrap_or_else(|| {
            panic!(
                "no sample {name}{labels:?} in the scrape: {:#?}",
                self.families
            )
        })
    }

    /// The family's type, if it is present.
    pub fn kind(&self, name: &str) -> Option<&str> {
        self.families.get(name).map(|f| f.kind.as_str())
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

/// Parses `{a="x",b="y"}` at the start of `rest`; returns the labels and what follows.
fn parse_labels(rest: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = rest
        .strip_prefix('{')
        .ok_or_else(|| "labels must start with {".to_owned())?;
    loop {
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("label without '=' in {rest:?}"))?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("invalid label name {name:?}"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name} value is not quoted"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {name} value is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("label {name}: bad escape {other:?}")),
                },
                Some((_, '\n')) => return Err(format!("label {name}: raw newline")),
                Some((_, c)) => value.push(c),
            }
        };
        rest = &rest[end + 1..];
        if labels.insert(name.to_owned(), value).is_some() {
            return Err(format!("label {name} repeated"));
        }
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(format!("expected ',' or '}}' in {rest:?}"));
        }
    }
}

fn sample_belongs(family: &str, kind: &str, sample: &str) -> bool {
    let suffix = sample.strip_prefix(family);
    match kind {
        "histogram" => matches!(suffix, Some("_bucket" | "_sum" | "_count")),
        "summary" => matches!(suffix, Some("" | "_sum" | "_count")),
        _ => sample == family,
    }
}

/// Parses a whole scrape strictly; the error names the line.
pub fn parse(text: &str) -> Result<Scrape, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the text does not end with a newline".to_owned());
    }
    let mut scrape = Scrape::default();
    let mut current: Option<String> = None;
    let mut helps: BTreeMap<String, String> = BTreeMap::new();
    let mut series = BTreeSet::new();
    for (number, line) in text.lines().enumerate() {
        let fail = |why: String| format!("line {}: {why}: {line:?}", number + 1);
        if line.trim().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let comment = comment.trim_start();
            if let Some(help) = comment.strip_prefix("HELP ") {
                let (name, doc) = help.split_once(' ').unwrap_or((help, ""));
                if !is_metric_name(name) {
                    return Err(fail(format!("invalid metric name {name:?}")));
                }
                if helps.insert(name.to_owned(), doc.to_owned()).is_some() {
                    return Err(fail(format!("second HELP for {name}")));
                }
            } else if let Some(kind) = comment.strip_prefix("TYPE ") {
                let (name, kind) = kind
                    .split_once(' ')
                    .ok_or_else(|| fail("TYPE without a type".to_owned()))?;
                if !is_metric_name(name) {
                    return Err(fail(format!("invalid metric name {name:?}")));
                }
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(fail(format!("unknown type {kind:?}")));
                }
                if scrape.families.contains_key(name) {
                    return Err(fail(format!("second TYPE for {name}")));
                }
                scrape.families.insert(
                    name.to_owned(),
                    Family {
                        kind: kind.to_owned(),
                        help: None,
                        samples: Vec::new(),
                    },
                );
                current = Some(name.to_owned());
            }
            continue;
        }
        let name_end = line
            .find(['{', ' '])
            .ok_or_else(|| fail("a sample without a value".to_owned()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(fail(format!("invalid metric name {name:?}")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(&fail)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let mut fields = rest
            .strip_prefix(' ')
            .ok_or_else(|| fail("no space before the value".to_owned()))?
            .split(' ');
        let value = fields
            .next()
            .and_then(parse_value)
            .ok_or_else(|| fail("the value is not a number".to_owned()))?;
        if let Some(timestamp) = fields.next() {
            timestamp
                .parse::<i64>()
                .map_err(|_| fail("the timestamp is not an integer".to_owned()))?;
        }
        if fields.next().is_some() {
            return Err(fail("trailing fields".to_owned()));
        }
        let family_name = current
            .clone()
            .ok_or_else(|| fail("a sample before any TYPE".to_owned()))?;
        let family = scrape
            .families
            .get_mut(&family_name)
            .ok_or_else(|| fail("no family".to_owned()))?;
        if !sample_belongs(&family_name, &family.kind, name) {
            return Err(fail(format!(
                "sample {name} is not of the current family {family_name} ({})",
                family.kind
            )));
        }
        if family.kind == "counter" && (value < 0.0 || value.is_nan()) {
            return Err(fail("a counter below zero".to_owned()));
        }
        if !series.insert((name.to_owned(), labels.clone())) {
            return Err(fail("a repeated series".to_owned()));
        }
        family.samples.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    for (name, help) in helps {
        let family = scrape
            .families
            .get_mut(&name)
            .ok_or_else(|| format!("HELP for {name}, which has no TYPE"))?;
        family.help = Some(help);
    }
    Ok(scrape)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_families_labels_and_escapes() {
        let text = "# HELP a_total Things.\n# TYPE a_total counter\n\
                    a_total{g=\"x\\\"y\",t=\"o\"} 3\n# TYPE b gauge\nb 1.5 1700000000\n";
        let scrape = parse(text).unwrap();
        assert_eq!(scrape.expect("a_total", &[("g", "x\"y"), ("t", "o")]), 3.0);
        assert_eq!(scrape.expect("b", &[]), 1.5);
        assert_eq!(scrape.kind("a_total"), Some("counter"));
        assert_eq!(scrape.families["a_total"].help.as_deref(), Some("Things."));
    }

    #[test]
    fn refuses_what_a_lenient_parser_would_skip() {
        for bad in [
            "a 1\n",                                  // no TYPE
            "# TYPE a gauge\na{x=1} 1\n",             // unquoted label value
            "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n", // repeated label
            "# TYPE a gauge\na one\n",                // not a number
            "# TYPE a gauge\nb 1\n",                  // not the current family
            "# TYPE a gauge\na 1\na 2\n",             // repeated series
            "# TYPE a gauge\n# TYPE a gauge\n",       // second TYPE
            "# TYPE a gauge\na 1",                    // no final newline
            "# TYPE a counter\na -1\n",               // negative counter
            "# TYPE a gauge\na{x=\"\\t\"} 1\n",       // unknown escape
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
