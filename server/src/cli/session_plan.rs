//! `wharf sessions plan`: what a reconcile would do from the ledger's exact history to the
//! configured filters, computed by the domain's pure `plan`, without touching the broker.

use std::process::ExitCode;

use crate::config::ResolvedSession;
use wharf::domain::session::{plan, ExactFilter, ManagedSession, Qos};

/// Prints the plan for `configured` from `state` (the ledger, loaded strongly).
pub fn print(
    session_id: &str,
    configured: Option<&ResolvedSession>,
    state: &ManagedSession,
    json: bool,
) -> anyhow::Result<ExitCode> {
    let Some(session) = configured else {
        anyhow::bail!(
            "session {session_id} is not configured here: a plan needs its desired filters \
             (name it in the [mqtt.sessions] of --config)"
        );
    };
    let Some(history) = &state.history else {
        anyhow::bail!(
            "session {} ({session_id}) has no baseline: its history is unknown and a reconcile \
             would not start. Seed it first: `wharf sessions seed {}` (explicitly empty) or \
             `wharf sessions seed '{}=FILTER,FILTER'` (the exact filters at the broker)",
            session.name,
            session.name,
            session.name
        );
    };
    let plan = plan(&session.desired(), history);
    if json {
        let with_qos = |list: &[(ExactFilter, Qos)]| -> Vec<serde_json::Value> {
            list.iter()
                .map(|(f, q)| serde_json::json!({ "filter": f.as_str(), "qos": q.level() }))
                .collect()
        };
        let names = |list: &[ExactFilter]| -> Vec<String> {
            list.iter().map(|f| f.as_str().to_owned()).collect()
        };
        let out = serde_json::json!({
            "session": session.name,
            "session_id": session_id,
            "remember": with_qos(&plan.remember),
            "subscribe": with_qos(&plan.subscribe),
            "unsubscribe": names(&plan.unsubscribe),
            "forget_after_verify": names(&plan.forget_after_verify),
            "recycle": !plan.unsubscribe.is_empty(),
            "migration_required": state.migration_required,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("plan for {} ({session_id}):", session.name);
    if let Some(reason) = &state.migration_required {
        println!("  MIGRATION REQUIRED ({reason}): no reconcile runs until the operator's migration procedure is done");
    }
    let section = |title: &str, items: Vec<String>| {
        println!(
            "  {title}: {}",
            if items.is_empty() {
                "nothing".to_owned()
            } else {
                items.join(" ")
            }
        );
    };
    let qos = |list: &[(ExactFilter, Qos)]| {
        list.iter()
            .map(|(f, q)| format!("{f}@{}", q.level()))
            .collect()
    };
    let plain = |list: &[ExactFilter]| list.iter().map(ToString::to_string).collect();
    section("remember (ledger, before SUBSCRIBE)", qos(&plan.remember));
    section("subscribe", qos(&plan.subscribe));
    section("unsubscribe", plain(&plan.unsubscribe));
    if !plan.unsubscribe.is_empty() {
        println!("  then recycle the connection and watch it for one mqtt.unmatched_grace");
    }
    section(
        "forget after verification",
        plain(&plan.forget_after_verify),
    );
    Ok(ExitCode::SUCCESS)
}
