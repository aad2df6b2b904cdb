//! A side of a diff: a backend plus the resolved configuration it runs with (numerics, model,
//! threads). The oracle and the candidate are each one side, so any two configurations can be
//! diffed: two backends, or one backend under two numerics settings.

use crate::DiffError;
use crate::report::SideInfo;
use dsv4_core::Numerics;
use dsv4_kernels::Backend;
use dsv4_kernels::registry::{self, BackendOptions};
use dsv4_model::ModelSource;
use dsv4_model::forward::ExecOptions;
use std::sync::Arc;

/// What a side is made of, before its backend is created.
#[derive(Debug, Clone, PartialEq)]
pub struct SideConfig {
    /// Backend registry name.
    pub backend: String,
    /// What the backend is created with (threads, device, the CUDA knobs).
    pub options: BackendOptions,
    /// Numerics knobs (spec §5), used by `--model`.
    pub numerics: Numerics,
    /// The model `--model` loads.
    pub model: ModelSource,
    /// How `--model` executes steps (captured or eager plans, streams, executor, faults).
    pub exec: ExecOptions,
}

impl SideConfig {
    /// The same side on another backend.
    pub fn with_backend(mut self, name: impl Into<String>) -> Self {
        self.backend = name.into();
        self
    }

    /// Create the backend from the registry; `role` ("oracle"/"candidate") labels errors.
    pub fn open(self, role: &'static str) -> Result<Side, DiffError> {
        let backend = registry::create(&self.backend, &self.options)
            .map_err(|source| DiffError::Backend { side: role, source })?;
        Ok(Side {
            config: self,
            backend,
        })
    }
}

/// A side ready to run: its configuration and its backend instance.
#[derive(Clone)]
pub struct Side {
    /// The configuration.
    pub config: SideConfig,
    /// The backend.
    pub backend: Arc<dyn Backend>,
}

impl std::fmt::Debug for Side {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Side")
            .field("config", &self.config)
            .field("backend", &self.backend.name())
            .finish()
    }
}

impl Side {
    /// A side from an existing backend instance (tests, wrappers); `config.backend` names it.
    pub fn with_backend(config: SideConfig, backend: Arc<dyn Backend>) -> Self {
        Side { config, backend }
    }

    /// What the report says about this side.
    pub fn info(&self) -> SideInfo {
        SideInfo {
            backend: self.config.backend.clone(),
            numerics: self.config.numerics,
            model: match &self.config.model {
                ModelSource::Tiny { seed } => format!("tiny (seed {seed})"),
                ModelSource::Dir(d) => d.display().to_string(),
            },
            threads: self.config.options.threads,
            sums: self.sums(),
        }
    }

    /// The sums this side asked of its backend, where the backend offers a choice.
    fn sums(&self) -> Option<&'static str> {
        let name = |f64_sums: bool| if f64_sums { "f64" } else { "f32" };
        let o = &self.config.options;
        match self.config.backend.as_str() {
            "cpu" => Some(name(!o.cpu_f32_sums)),
            b if b.starts_with("cuda") => o.f64_sums.map(name),
            _ => None,
        }
    }
}

impl Default for SideConfig {
    /// The reference backend on the tiny model with default numerics.
    fn default() -> Self {
        SideConfig {
            backend: dsv4_backend_reference::NAME.to_string(),
            options: BackendOptions::default(),
            numerics: Numerics::default(),
            model: ModelSource::Tiny { seed: 0 },
            exec: ExecOptions::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sides_open_from_the_registry_and_unknown_backends_name_the_registered_ones() {
        dsv4_backend_reference::link();
        let cfg = SideConfig {
            options: BackendOptions {
                threads: 3,
                ..BackendOptions::default()
            },
            model: ModelSource::Tiny { seed: 9 },
            ..SideConfig::default()
        };
        let side = cfg.clone().open("oracle").unwrap();
        assert_eq!(side.backend.name(), "reference");
        assert_eq!(side.info().model, "tiny (seed 9)");
        assert_eq!(side.info().threads, 3);
        assert_eq!(side.info().sums, None, "the reference has one kind of sums");
        // The sums a side asks for are named in its report line (the config alone decides).
        let named = |backend: &str, options: BackendOptions| {
            let side = Side {
                config: SideConfig {
                    options,
                    ..cfg.clone().with_backend(backend)
                },
                ..cfg.clone().open("oracle").unwrap()
            };
            side.info().sums
        };
        let f32_cpu = BackendOptions {
            cpu_f32_sums: true,
            ..BackendOptions::default()
        };
        assert_eq!(named("cpu", f32_cpu), Some("f32"));
        assert_eq!(named("cpu", BackendOptions::default()), Some("f64"));
        assert_eq!(named("cuda-sm120", BackendOptions::default()), None);
        let f64_cuda = BackendOptions {
            f64_sums: Some(true),
            ..BackendOptions::default()
        };
        assert_eq!(named("cuda-emu", f64_cuda), Some("f64"));
        let e = cfg
            .with_backend("no-such-backend")
            .open("candidate")
            .unwrap_err();
        let text = e.to_string();
        assert!(
            text.starts_with("candidate side: unknown backend `no-such-backend`"),
            "{text}"
        );
        assert!(text.contains("reference"), "{text}");
    }
}
