//! Seed specifications, as the CLI and a container init step give them:
//! `SESSION` (an explicit empty baseline) or `SESSION=FILTER,FILTER` (the exact filters that
//! exist at the broker). `SESSION` is a configured session's name or a durable identity
//! (`ms-...`). A filter that itself holds a comma is given with `--filter` instead.

use wharf_domain::session::ExactFilter;

use crate::error::SessionError;

/// A parsed seed specification.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedSpec {
    /// The session's configured name or durable identity.
    pub session: String,
    /// The exact filters to seed (empty: an explicit empty baseline).
    pub filters: Vec<ExactFilter>,
}

/// Parses `SESSION` or `SESSION=FILTER,FILTER,...`, naming what is wrong.
pub fn parse_seed_spec(spec: &str) -> Result<SeedSpec, SessionError> {
    let (session, list) = match spec.split_once('=') {
        Some((session, list)) => (session.trim(), Some(list)),
        None => (spec.trim(), None),
    };
    if session.is_empty() {
        return Err(SessionError::Config(format!(
            "seed \"{spec}\" names no session: use SESSION or 'SESSION=FILTER,FILTER'"
        )));
    }
    let mut filters = Vec::new();
    if let Some(list) = list {
        if list.trim().is_empty() {
            return Err(SessionError::Config(format!(
                "seed \"{spec}\" has '=' but no filter: for an explicit empty baseline give \
                 the session alone (\"{session}\")"
            )));
        }
        for filter in list.split(',') {
            filters.push(ExactFilter::parse_field("seed filter", filter)?);
        }
    }
    Ok(SeedSpec {
        session: session.to_owned(),
        filters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_alone_is_an_explicit_empty_baseline() {
        let spec = parse_seed_spec("plant").expect("valid");
        assert_eq!(spec.session, "plant");
        assert!(spec.filters.is_empty());
    }

    #[test]
    fn filters_are_kept_exactly_shared_forms_included() {
        let spec = parse_seed_spec("ms-0123=sensors/#,$share/g/sensors/#").expect("valid");
        let filters: Vec<&str> = spec.filters.iter().map(ExactFilter::as_str).collect();
        assert_eq!(filters, ["sensors/#", "$share/g/sensors/#"]);
    }

    #[test]
    fn bad_specs_name_the_problem() {
        let e = parse_seed_spec("=a/#").expect_err("no session").to_string();
        assert!(e.contains("names no session"), "{e}");
        let e = parse_seed_spec("plant=")
            .expect_err("no filter")
            .to_string();
        assert!(e.contains("explicit empty baseline"), "{e}");
        let e = parse_seed_spec("plant=a/#/b")
            .expect_err("bad filter")
            .to_string();
        assert!(e.contains("a/#/b"), "{e}");
    }
}
