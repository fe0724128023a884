//! How a registry entry appears in a config: `{ kind = "NAME", ...parameters }` ([`Spec`]),
//! and the traits shared by every entry ([`Kind`], [`Entry`]).

use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What every entry's parameters are: a typed struct (`#[serde(deny_unknown_fields)]`, so an
/// unknown key is refused naming it) with its name, aliases and one line of help.
pub trait Kind: Serialize + DeserializeOwned + Clone + 'static {
    /// The canonical name, as written in configs (`snake_case`).
    const NAME: &'static str;
    /// Other names accepted for it (spelling `-` or `_` alike).
    const ALIASES: &'static [&'static str] = &[];
    /// One line of help for `--help`, the docs and error messages.
    const SUMMARY: &'static str;

    /// Checks the parameters' values (types and unknown keys are checked by parsing).
    ///
    /// # Errors
    /// What is wrong, naming the parameter.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// A short description with the parameters, e.g. `fixed k=4`.
    fn describe(&self) -> String {
        Self::NAME.to_string()
    }
}

/// Why a config entry was refused: its text, and whether it did not parse (an unknown kind or
/// key, a value of the wrong type) rather than hold a bad value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// What is wrong, naming the kind and key or value.
    pub message: String,
    /// True for parse errors, false for bad values.
    pub is_parse: bool,
}

impl SpecError {
    fn parse(message: String) -> Self {
        Self {
            message,
            is_parse: true,
        }
    }
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<SpecError> for String {
    fn from(e: SpecError) -> Self {
        e.message
    }
}

/// The object-safe face of an entry, whatever its role: the registry lists these.
pub trait Entry: Sync {
    /// The canonical name.
    fn name(&self) -> &'static str;
    /// The aliases.
    fn aliases(&self) -> &'static [&'static str];
    /// One line of help.
    fn summary(&self) -> &'static str;
    /// Parses `params` and checks their values.
    ///
    /// # Errors
    /// The parse error (unknown key, wrong type) or [`Kind::check`]'s.
    fn check(&self, params: &toml::Table) -> Result<(), SpecError>;
    /// [`Kind::describe`] of the parsed parameters (the name when they do not parse).
    fn describe(&self, params: &toml::Table) -> String;
}

/// A registry entry for the parameter type `K` (one line of the registry:
/// `&Registered::<MyDrafter>::ENTRY`).
pub struct Registered<K>(PhantomData<fn() -> K>);

impl<K> Registered<K> {
    /// The entry.
    pub const ENTRY: Self = Registered(PhantomData);
}

impl<K: Kind> Registered<K> {
    /// `params` parsed as `K`.
    ///
    /// # Errors
    /// The parse error, naming the key or type at fault.
    pub fn parse(params: &toml::Table) -> Result<K, String> {
        K::deserialize(toml::Value::Table(params.clone())).map_err(|e| {
            let message = e.to_string();
            format!("{}: {}", K::NAME, message.trim_end())
        })
    }
}

impl<K: Kind> Entry for Registered<K> {
    fn name(&self) -> &'static str {
        K::NAME
    }
    fn aliases(&self) -> &'static [&'static str] {
        K::ALIASES
    }
    fn summary(&self) -> &'static str {
        K::SUMMARY
    }
    fn check(&self, params: &toml::Table) -> Result<(), SpecError> {
        Self::parse(params)
            .map_err(SpecError::parse)?
            .check()
            .map_err(|message| SpecError {
                message,
                is_parse: false,
            })
    }
    fn describe(&self, params: &toml::Table) -> String {
        Self::parse(params).map_or_else(|_| K::NAME.to_string(), |k| k.describe())
    }
}

/// The role an entry plays (drafter, verifier or policy): names it in messages and lists its
/// entries.
pub trait Role: 'static {
    /// `drafter`, `verifier` or `policy`.
    const WHAT: &'static str;
    /// The object-safe entry type of this role.
    type Entry: ?Sized + Entry + 'static;
    /// Every entry of this role, in registry order.
    fn entries() -> &'static [&'static Self::Entry];
}

/// `name` as compared with entry names: lower case, `-` read as `_`.
pub fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

/// The entry of role `R` called `name` (or one of its aliases).
///
/// # Errors
/// An unknown name, with every known name and its aliases listed.
pub fn lookup<R: Role>(name: &str) -> Result<&'static R::Entry, String> {
    let wanted = normalise(name);
    R::entries()
        .iter()
        .copied()
        .find(|e| {
            normalise(e.name()) == wanted || e.aliases().iter().any(|a| normalise(a) == wanted)
        })
        .ok_or_else(|| {
            format!(
                "unknown {} kind `{name}`; known: {}",
                R::WHAT,
                names_with_aliases::<R>()
            )
        })
}

/// `a (alias, alias), b, …` for every entry of role `R`.
pub fn names_with_aliases<R: Role>() -> String {
    R::entries()
        .iter()
        .map(|e| match e.aliases() {
            [] => e.name().to_string(),
            aliases => format!("{} ({})", e.name(), aliases.join(", ")),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// One entry of role `R` as written in a config: `{ kind = "NAME", ...parameters }`. `kind` may
/// be an alias; [`Spec::canonical`] (run by config validation) rewrites it to the canonical
/// name. The parameters are checked by the entry ([`Spec::check`]).
pub struct Spec<R> {
    kind: String,
    params: toml::Table,
    role: PhantomData<fn() -> R>,
}

impl<R> Clone for Spec<R> {
    fn clone(&self) -> Self {
        Self {
            kind: self.kind.clone(),
            params: self.params.clone(),
            role: PhantomData,
        }
    }
}

impl<R> PartialEq for Spec<R> {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.params == other.params
    }
}

impl<R> fmt::Debug for Spec<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{ kind = {:?}", self.kind)?;
        for (key, value) in &self.params {
            write!(f, ", {key} = {value}")?;
        }
        write!(f, " }}")
    }
}

impl<R: Role> Spec<R> {
    /// The config of entry `K` with parameters `params` (e.g. `DrafterConfig::of(Tree {
    /// branching: vec![3, 2, 1] })`).
    pub fn of<K: Kind>(params: K) -> Self {
        let table = match toml::Value::try_from(&params) {
            Ok(toml::Value::Table(table)) => table,
            _ => toml::Table::new(),
        };
        Self {
            kind: K::NAME.to_string(),
            params: table,
            role: PhantomData,
        }
    }

    /// The config `{ kind = kind, ...params }` (checked when validated or built).
    pub fn new(kind: &str, params: toml::Table) -> Self {
        Self {
            kind: kind.to_string(),
            params,
            role: PhantomData,
        }
    }

    /// The kind as written (canonical after validation).
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The parameters (every key but `kind`).
    pub fn params(&self) -> &toml::Table {
        &self.params
    }

    /// Whether this is entry `K` (by canonical name or alias).
    pub fn is<K: Kind>(&self) -> bool {
        self.entry().is_ok_and(|e| e.name() == K::NAME)
    }

    /// The parameters parsed as `K`, when this is entry `K`.
    pub fn as_kind<K: Kind>(&self) -> Option<K> {
        if !self.is::<K>() {
            return None;
        }
        Registered::<K>::parse(&self.params).ok()
    }

    /// The registry entry of this kind.
    ///
    /// # Errors
    /// An unknown kind (the message lists the known ones).
    pub fn entry(&self) -> Result<&'static R::Entry, String> {
        lookup::<R>(&self.kind)
    }

    /// Checks the kind and the parameters and rewrites `kind` to its canonical name.
    ///
    /// # Errors
    /// An unknown kind, an unknown key, a bad value: the message names it.
    pub fn canonical(&mut self) -> Result<&'static R::Entry, SpecError> {
        let entry = self.entry().map_err(SpecError::parse)?;
        entry.check(&self.params)?;
        self.kind = entry.name().to_string();
        Ok(entry)
    }

    /// A short description with the parameters, e.g. `tree [3, 2, 1]`.
    pub fn describe(&self) -> String {
        match self.entry() {
            Ok(entry) => entry.describe(&self.params),
            Err(_) => self.kind.clone(),
        }
    }
}

impl<R> Serialize for Spec<R> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut table = toml::Table::new();
        table.insert("kind".into(), toml::Value::String(self.kind.clone()));
        table.extend(self.params.clone());
        table.serialize(serializer)
    }
}

impl<'de, R: Role> Deserialize<'de> for Spec<R> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut params = toml::Table::deserialize(deserializer)?;
        let kind = match params.remove("kind") {
            Some(toml::Value::String(kind)) => kind,
            Some(other) => {
                return Err(serde::de::Error::custom(format!(
                    "the {} kind must be a string, found {other}",
                    R::WHAT
                )))
            }
            None => {
                return Err(serde::de::Error::custom(format!(
                    "missing field `kind` (the {} to use; known: {})",
                    R::WHAT,
                    names_with_aliases::<R>()
                )))
            }
        };
        Ok(Self {
            kind,
            params,
            role: PhantomData,
        })
    }
}
