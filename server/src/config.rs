//! The `specdec serve CONFIG` file: an experiment config's `[models]` and `[[methods]]` tables,
//! nothing else (sampling settings, prompts and `max_tokens` come with each request, so those
//! keys are refused, never ignored).
//!
//! ```toml
//! [models]
//! target = "qwen2.5-coder-1.5b"
//! draft = "qwen2.5-coder-0.5b"
//! kv_memory = "4GiB"
//!
//! [[methods]]
//! name = "auto"
//! drafter = { kind = "chain" }
//! policy = { kind = "cost_optimal", k_max = 6 }
//! ```
//!
//! The methods are checked exactly as `specdec run` checks them; the server serves one, named
//! by `--method` (or the only one the file lists besides plain decoding).

use std::path::Path;

use specdec_harness::config::{ExperimentConfig, MethodConfig, ModelsConfig};
use specdec_harness::HarnessError;

use crate::error::{Result, ServerError};

/// The tables of a serve config file.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Target, draft, device, KV memory and KV element type.
    pub models: ModelsConfig,
    /// The methods listed (validated as an experiment's), in file order; a plain-decoding
    /// `baseline` is not added.
    pub methods: Vec<MethodConfig>,
}

/// Keys a serve config may hold.
const SERVE_KEYS: [&str; 2] = ["models", "methods"];

impl ServeConfig {
    /// Reads and checks a serve config file ([`ServeConfig::parse`]).
    ///
    /// # Errors
    /// An unreadable file; as [`ServeConfig::parse`].
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| ServerError::Io {
            what: format!("reading the config {}", path.display()),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Parses config text; `origin` names it in errors.
    ///
    /// # Errors
    /// TOML errors; a key other than `models` and `methods` (named, with why); no method; a
    /// simulated or toy target; any error `specdec run` gives for these tables.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let parse_error = |message: String| {
            ServerError::Harness(HarnessError::ConfigParse {
                origin: origin.to_string(),
                message,
            })
        };
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| parse_error(e.to_string().trim_end().to_string()))?;
        if let Some(key) = table.keys().find(|k| !SERVE_KEYS.contains(&k.as_str())) {
            return Err(parse_error(format!(
                "`{key}`: a serve config takes only the [models] and [[methods]] tables (sampling \
                 settings, prompts and max_tokens come with each request)"
            )));
        }
        if !table.contains_key("methods") {
            return Err(parse_error(
                "no [[methods]]: list the method to serve".to_string(),
            ));
        }
        let target = table
            .get("models")
            .and_then(|m| m.get("target"))
            .and_then(toml::Value::as_str);
        match target {
            None => {
                return Err(parse_error(
                    "no models.target: name the model to serve".to_string(),
                ))
            }
            Some(target @ ("simulated" | "toy")) => {
                return Err(ServerError::InvalidOption(format!(
                    "{origin}: models.target is `{target}`: the server needs a model file or a \
                     registry name"
                )))
            }
            Some(_) => {}
        }
        // validated as an experiment with placeholder prompts, so every method is checked the
        // way `specdec run` checks it
        let listed = table
            .get("methods")
            .and_then(toml::Value::as_array)
            .map_or(0, Vec::len);
        table.insert("name".into(), "serve".into());
        table.insert("max_tokens".into(), 1.into());
        let mut prompts = toml::Table::new();
        prompts.insert("source".into(), "inline".into());
        prompts.insert("texts".into(), vec![toml::Value::from("-")].into());
        table.insert("prompts".into(), prompts.into());
        let text = toml::to_string(&table).map_err(|e| parse_error(e.to_string()))?;
        let loaded = ExperimentConfig::from_toml(&text, origin)?;
        let mut config = loaded.config;
        if config.methods.len() > listed {
            // the experiment check added a plain baseline at the front: a server serves one
            config.methods.remove(0);
        }
        Ok(ServeConfig {
            models: config.models,
            methods: config.methods,
        })
    }

    /// The method to serve: the one named `name`, else the only one listed besides plain
    /// decoding (or the only one at all).
    ///
    /// # Errors
    /// An unknown name, or several methods and no name (both listing the names).
    pub fn method(&self, name: Option<&str>) -> Result<MethodConfig> {
        let names = || {
            self.methods
                .iter()
                .map(|m| m.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if let Some(name) = name {
            return self
                .methods
                .iter()
                .find(|m| m.name == name)
                .cloned()
                .ok_or_else(|| {
                    ServerError::InvalidOption(format!(
                        "--method {name}: the config lists {}",
                        names()
                    ))
                });
        }
        let speculative: Vec<&MethodConfig> =
            self.methods.iter().filter(|m| !m.is_baseline()).collect();
        match (speculative.as_slice(), self.methods.as_slice()) {
            ([one], _) => Ok((*one).clone()),
            ([], [one]) => Ok(one.clone()),
            _ => Err(ServerError::InvalidOption(format!(
                "the config lists several methods ({}): choose one with --method",
                names()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[models]
target = "smollm2-135m"
kv_memory = "1GiB"

[[methods]]
name = "ngram-k3"
drafter = { kind = "ngram", n = 3 }
policy = { kind = "fixed", k = 3 }
"#;

    #[test]
    fn a_config_gives_its_models_and_its_one_method() {
        let config = ServeConfig::parse(GOOD, "serve.toml").unwrap();
        assert_eq!(config.models.target, "smollm2-135m");
        assert_eq!(config.models.kv_memory.as_deref(), Some("1GiB"));
        assert_eq!(config.methods.len(), 1, "no baseline added");
        assert_eq!(config.method(None).unwrap().name, "ngram-k3");
        assert_eq!(config.method(Some("ngram-k3")).unwrap().name, "ngram-k3");
        let err = config.method(Some("eagle")).unwrap_err().to_string();
        assert!(err.contains("eagle") && err.contains("ngram-k3"), "{err}");
    }

    #[test]
    fn keys_the_server_would_ignore_and_bad_methods_are_refused_by_name() {
        let with_sampling = format!("{GOOD}\n[sampling]\ntemperature = 1.0\n");
        let err = ServeConfig::parse(&with_sampling, "serve.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("`sampling`") && err.contains("serve.toml"),
            "{err}"
        );
        let err = ServeConfig::parse("[models]\ntarget = \"smollm2-135m\"\n", "s.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("[[methods]]"), "{err}");
        let bad_k = GOOD.replace("k = 3", "k = 0");
        let err = ServeConfig::parse(&bad_k, "s.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("k"), "{err}");
        let unknown = GOOD.replace("kv_memory", "kv_memroy");
        let err = ServeConfig::parse(&unknown, "s.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kv_memroy"), "{err}");
        let simulated = GOOD.replace("target = \"smollm2-135m\"", "target = \"simulated\"");
        let err = ServeConfig::parse(&simulated, "s.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("simulated"), "{err}");
        let two = format!(
            "{GOOD}\n[[methods]]\nname = \"linear\"\ndrafter = {{ kind = \"ngram\", n = 3 }}\npolicy = {{ kind = \"fixed\", k = 2 }}\n"
        );
        let config = ServeConfig::parse(&two, "s.toml").unwrap();
        let err = config.method(None).unwrap_err().to_string();
        assert!(err.contains("--method") && err.contains("linear"), "{err}");
    }
}
