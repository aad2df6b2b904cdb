//! Incident documents: the records of one incident rendered with minijinja (strict undefined) from
//! `ledger/templates/incident.md.j2` when the repository has one, else the embedded default.

use crate::error::LedgerError;
use crate::record::{Kind, Record, Status};
use crate::store::{Ledger, TEMPLATE_PATH, incident_path};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// The default incident template, compiled into the binary.
pub const DEFAULT_TEMPLATE: &str = include_str!("../../../ledger/templates/incident.md.j2");

/// The template text of the repository at `ledger.root`, or the default, with its name.
pub fn template_text(ledger: &Ledger) -> Result<(String, String), LedgerError> {
    let path = ledger.root.join(TEMPLATE_PATH);
    if path.is_file() {
        let text = std::fs::read_to_string(&path).map_err(|e| LedgerError::io(&path, e))?;
        Ok((TEMPLATE_PATH.to_string(), text))
    } else {
        Ok((
            "embedded:incident.md.j2".to_string(),
            DEFAULT_TEMPLATE.to_string(),
        ))
    }
}

/// The document of `incident` (repository-relative path and text).
pub fn render_incident(ledger: &Ledger, incident: &str) -> Result<(String, String), LedgerError> {
    let (name, text) = template_text(ledger)?;
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    let err = |e: minijinja::Error| LedgerError::Template {
        name: name.clone(),
        message: format!("{e:#}"),
    };
    env.add_template_owned(name.clone(), text).map_err(err)?;
    let ctx = context(ledger, incident);
    let mut doc = env
        .get_template(&name)
        .map_err(err)?
        .render(minijinja::Value::from(minijinja::value::Serde(&ctx)))
        .map_err(err)?;
    if !doc.ends_with('\n') {
        doc.push('\n');
    }
    Ok((incident_path(incident), doc))
}

/// Every incident's document (repository-relative path and text).
pub fn render_all(ledger: &Ledger) -> Result<Vec<(String, String)>, LedgerError> {
    ledger
        .incidents()
        .iter()
        .map(|i| render_incident(ledger, i))
        .collect()
}

/// The template context of one incident.
fn context(ledger: &Ledger, incident: &str) -> Value {
    let superseded_by = ledger.superseded_by();
    let records: Vec<&Record> = ledger
        .records
        .iter()
        .filter(|r| r.incident == incident)
        .collect();
    let by_id: BTreeMap<&str, &Record> =
        ledger.records.iter().map(|r| (r.id.as_str(), r)).collect();
    let successors = |r: &Record| superseded_by.get(&r.id).cloned().unwrap_or_default();
    // A record's fate: its own status, or that of the latest record superseding it.
    let fate_of = |r: &Record| -> (Status, Option<&Record>) {
        let last = successors(r)
            .iter()
            .filter_map(|id| by_id.get(id.as_str()).copied())
            .max_by(|a, b| (&a.date, &a.id).cmp(&(&b.date, &b.id)));
        match last {
            Some(s) if s.status == Status::Validated && s.change == r.change => {
                (Status::Validated, Some(s))
            }
            Some(s) if s.status == Status::Falsified => (Status::Falsified, Some(s)),
            Some(s) => (Status::Superseded, Some(s)),
            None => (r.status, None),
        }
    };
    let mut impact = Vec::new();
    let mut commands = Vec::new();
    let mut validated = Vec::new();
    let mut root_cause = Value::Null;
    let mut items = Vec::new();
    for r in &records {
        let (fate, successor) = fate_of(r);
        let killed_by = match (fate, successor) {
            (Status::Falsified, Some(s)) => record_json(s),
            (Status::Falsified, None) => record_json(r),
            _ => Value::Null,
        };
        if fate == Status::Validated && successor.is_none() {
            if r.kind == Kind::ConfigChange {
                validated.push(record_json(r));
            }
            if !r.hypothesis.is_empty() {
                root_cause = Value::String(r.hypothesis.clone());
            }
        }
        for e in &r.evidence {
            if let Some(ab) = &e.ab {
                impact.push(format!("{} (`{}`)", ab.line(), r.id));
                if !ab.command.is_empty() && !commands.contains(&ab.command) {
                    commands.push(ab.command.clone());
                }
            }
        }
        let mut item = record_json(r);
        item["fate"] = json!(fate.as_str());
        item["superseded_by"] = json!(successors(r));
        item["killed_by"] = killed_by;
        items.push(item);
    }
    let status = if !validated.is_empty() {
        "mitigated"
    } else if records.is_empty() {
        "unknown"
    } else {
        "open"
    };
    json!({
        "incident": incident,
        "status": status,
        "first_date": records.first().map(|r| r.date.clone()),
        "last_date": records.last().map(|r| r.date.clone()),
        "records": items,
        "validated_changes": validated,
        "impact": impact,
        "root_cause": root_cause,
        "commands": commands,
    })
}

/// A record as template data: its fields plus, per evidence file, formatted A/B numbers.
fn record_json(r: &Record) -> Value {
    let mut v = serde_json::to_value(r).unwrap_or(Value::Null);
    v["change"] = serde_json::to_value(&r.change).unwrap_or(Value::Null);
    let evidence: Vec<Value> = r
        .evidence
        .iter()
        .map(|e| {
            let mut ev = serde_json::to_value(e).unwrap_or(Value::Null);
            ev["ab"] = serde_json::to_value(&e.ab).unwrap_or(Value::Null);
            let interval = |lo: f64, hi: f64| format!("{:.1}%, {:.1}%", 100.0 * lo, 100.0 * hi);
            let (summary, a_int, b_int, p, tp) = match &e.ab {
                Some(ab) => (
                    ab.line(),
                    interval(ab.a.ci_low, ab.a.ci_high),
                    interval(ab.b.ci_low, ab.b.ci_high),
                    format!("{:.3e}", ab.p_value),
                    format!("{:+.1}%", 100.0 * ab.throughput_delta),
                ),
                None => (
                    format!("sha256 {}", &e.sha256),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ),
            };
            ev["summary"] = json!(summary);
            ev["a_interval"] = json!(a_int);
            ev["b_interval"] = json!(b_int);
            ev["p_value"] = json!(p);
            ev["throughput"] = json!(tp);
            ev
        })
        .collect();
    v["evidence"] = json!(evidence);
    v
}
