//! `[storage]` and the sources' `retain_days` / `max_gb`: what the storage thread is told.

use std::collections::HashMap;

use toml::Spanned;

use super::raw::{RawSource, RawStorage};
use crate::spec::Diagnostic;
use crate::storage::{Floor, Retention, StorageConfig};

pub(super) fn resolve_storage(
    storage: &RawStorage,
    sources: &[(Spanned<String>, RawSource)],
    diags: &mut Vec<Diagnostic>,
) -> StorageConfig {
    let mut floor = Floor::default();
    if let Some(gb) = &storage.min_free_gb {
        if *gb.get_ref() > 0.0 && gb.get_ref().is_finite() {
            floor.min_free_bytes = Some((gb.get_ref() * 1e9) as u64);
        } else {
            diags.push(Diagnostic::at(
                gb.span(),
                format!(
                    "storage: min_free_gb must be more than 0, not {}",
                    gb.get_ref()
                ),
            ));
        }
    }
    if let Some(p) = &storage.min_free_percent {
        if *p.get_ref() > 0.0 && *p.get_ref() < 100.0 {
            floor.min_free_percent = Some(*p.get_ref());
        } else {
            diags.push(Diagnostic::at(
                p.span(),
                format!(
                    "storage: min_free_percent must be more than 0 and less than 100, not {}",
                    p.get_ref()
                ),
            ));
        }
    }
    let mut by_source = HashMap::new();
    for (name, s) in sources {
        match Retention::parse(s.retain_days.clone(), s.max_gb.clone(), None) {
            Ok(r) if r.is_set() => {
                by_source.insert(name.get_ref().clone(), r);
            }
            Ok(_) => {}
            Err(d) => diags.push(d.of(&format!("source \"{}\"", name.get_ref()))),
        }
    }
    StorageConfig {
        floor,
        sources: by_source,
    }
}
