//! Checking a metrics exposition: with the real Prometheus parser and
//! `promlint` ([`promlint`]), and reading its samples back ([`samples`]);
//! what a shipped Grafana dashboard asks for ([`dashboard_metrics`]).

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use crate::binaries::{Component, find_binary};

/// Parses `text` with Prometheus's own scrape parser and lints every family
/// (HELP, TYPE, naming and unit conventions) with client_golang's promlint;
/// the error lists every problem found.
pub fn promlint(text: &str) -> anyhow::Result<()> {
    let binary = find_binary(Component::Promlint)?;
    let mut child = Command::new(&binary)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes())?;
    }
    let output = child.wait_with_output()?;
    anyhow::ensure!(
        output.status.success(),
        "promlint ({}) rejects the metrics:\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// One sample line of an exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name, `gkm_gpu_temperature_celsius`.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

impl Sample {
    /// The value of label `name`, if the sample has it.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// The samples of an exposition, in order, for assertions on what a scrape
/// shows. Comment lines are skipped; a line that does not read as a sample
/// is an error. (Validity is [`promlint`]'s job; this only reads.)
pub fn samples(text: &str) -> anyhow::Result<Vec<Sample>> {
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        out.push(sample(line).ok_or_else(|| anyhow::anyhow!("not a sample: {line:?}"))?);
    }
    Ok(out)
}

fn sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => return None,
    };
    let mut labels = BTreeMap::new();
    let mut rest = rest;
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices();
        let mut key = String::new();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '}' => break i,
                ',' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut value = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => value.push('\n'),
                                other => value.push(other),
                            },
                            c => value.push(c),
                        }
                    }
                    labels.insert(std::mem::take(&mut key), value);
                }
                c => key.push(c),
            }
        };
        rest = &body[end + 1..];
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Every `gkm_…` metric name a Grafana dashboard's queries name: its
/// panels' targets and its templating variables' definitions, in order.
pub fn dashboard_metrics(dashboard: &serde_json::Value) -> Vec<String> {
    let panels = dashboard["panels"].as_array().into_iter().flatten();
    let targets = panels.flat_map(|p| p["targets"].as_array().into_iter().flatten());
    let exprs = targets.map(|t| &t["expr"]);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten();
    let definitions = variables.map(|v| &v["definition"]);
    let mut names = Vec::new();
    for text in exprs
        .chain(definitions)
        .filter_map(serde_json::Value::as_str)
    {
        let mut rest = text;
        while let Some(at) = rest.find("gkm_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            names.push(name);
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_names_labels_and_values() {
        let text = "# HELP x X.\nx_total{a=\"1\",b=\"q\\\"uote\"} 3\nup 1\n# EOF\n";
        let got = samples(text).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].name, "x_total");
        assert_eq!(got[0].label("b"), Some("q\"uote"));
        assert_eq!(got[0].value, 3.0);
        assert_eq!(got[1].name, "up");
        assert!(samples("garbage{").is_err());
    }
}
