//! Typed records of state: a strategy declares what it keeps between steps as a struct
//! ([`record!`](crate::record)), and the struct is written into a [`StateDict`] and read
//! back field by field, each field under its name, as Burn's `#[derive(Record)]` does for a
//! module. No key is written by hand.
//!
//! | field type | stored as |
//! |---|---|
//! | `u64`, `usize`, `bool` | a number (`bool`: 0 or 1) |
//! | `f64` | a number: its bits, exactly |
//! | [`Values`] | flat `f32` values (a tensor's, or host buffers) |
//! | [`Bytes`], [`OptimizerState`] | a byte buffer |
//! | a record | its fields under `name/` |
//! | [`StateDict`] | its entries under `name/` (the state of a component held as a trait object) |
//! | `Option<T>` | `T`, or nothing |
//! | `Vec<T>` | element `i` under `name{i}` |

use super::record::{StateDict, canonical_record};
use crate::error::{GymError, Result};
use burn::optim::ModuleOptimizer;
use burn::tensor::{Device, Tensor, TensorData};

/// A value that a record stores under a key of a [`StateDict`].
pub trait StateField: Sized {
    /// Writes `self` under `key`.
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()>;

    /// Reads the value under `key`; a missing one is a [`GymError::Checkpoint`] naming it.
    fn load(key: &str, state: &StateDict) -> Result<Self>;

    /// Whether anything is stored under `key`.
    fn present(key: &str, state: &StateDict) -> bool;
}

/// A struct of [`StateField`]s, written and read as a whole: what [`record!`](crate::record)
/// declares.
pub trait Record: Sized {
    /// The record as a [`StateDict`].
    fn to_state(&self) -> Result<StateDict> {
        let mut state = StateDict::new();
        self.save_fields(&mut state)?;
        Ok(state)
    }

    /// The record stored in `state`.
    fn from_state(state: &StateDict) -> Result<Self>;

    /// Writes every field under its name.
    fn save_fields(&self, state: &mut StateDict) -> Result<()>;
}

/// Declares a record: a struct whose fields are [`StateField`]s, written into a
/// [`StateDict`] each under its name (or under the name after `as`, where a stored name
/// must differ from the field's).
///
/// ```
/// use gym_core::state::fields::{Record, Values};
///
/// gym_core::record! {
///     /// What a momentum method keeps.
///     pub struct MomentumRecord {
///         /// The velocity.
///         pub velocity: Values,
///         /// Steps taken.
///         pub steps: u64,
///     }
/// }
///
/// let record = MomentumRecord { velocity: Values::from(vec![0.5, -1.0]), steps: 3 };
/// let state = record.to_state().unwrap();
/// let back = MomentumRecord::from_state(&state).unwrap();
/// assert_eq!((back.velocity.into_vec(), back.steps), (vec![0.5, -1.0], 3));
/// ```
#[macro_export]
macro_rules! record {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident $(as $key:literal)? : $ty:ty
            ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                $(#[$field_meta])*
                $field_vis $field: $ty,
            )*
        }

        impl $crate::state::fields::Record for $name {
            fn from_state(
                state: &$crate::state::StateDict,
            ) -> $crate::Result<Self> {
                Ok($name {
                    $(
                        $field: <$ty as $crate::state::fields::StateField>::load(
                            $crate::record!(@key $field $($key)?),
                            state,
                        )?,
                    )*
                })
            }

            fn save_fields(
                &self,
                state: &mut $crate::state::StateDict,
            ) -> $crate::Result<()> {
                $(
                    $crate::state::fields::StateField::save(
                        &self.$field,
                        $crate::record!(@key $field $($key)?),
                        state,
                    )?;
                )*
                Ok(())
            }
        }

        impl $crate::state::fields::StateField for $name {
            fn save(
                &self,
                key: &str,
                state: &mut $crate::state::StateDict,
            ) -> $crate::Result<()> {
                state.insert_child(key, $crate::state::fields::Record::to_state(self)?);
                Ok(())
            }

            fn load(key: &str, state: &$crate::state::StateDict) -> $crate::Result<Self> {
                <$name as $crate::state::fields::Record>::from_state(&state.child(key))
            }

            fn present(key: &str, state: &$crate::state::StateDict) -> bool {
                state.has_child(key)
            }
        }
    };
    (@key $field:ident $key:literal) => { $key };
    (@key $field:ident) => { stringify!($field) };
}

/// Flat `f32` values, kept exactly (their bits): a tensor's, or a host buffer's.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Values {
    values: Vec<f32>,
    /// Where they were read from, for error messages.
    key: String,
}

impl From<Vec<f32>> for Values {
    fn from(values: Vec<f32>) -> Self {
        Values {
            values,
            key: String::new(),
        }
    }
}

impl Values {
    /// A flat tensor's values.
    pub fn of(tensor: &Tensor<1>) -> Result<Self> {
        let values = tensor
            .to_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .map_err(|e| GymError::Checkpoint(format!("a tensor's values: {e:?}")))?;
        Ok(Values::from(values))
    }

    /// The values, checked to be `len` of them.
    pub fn into_vec_of(self, len: usize) -> Result<Vec<f32>> {
        if self.values.len() != len {
            return Err(GymError::Checkpoint(format!(
                "`{}` holds {} values where this run has {len}",
                self.key,
                self.values.len()
            )));
        }
        Ok(self.values)
    }

    /// The values as a tensor on `device`, checked to be `len` of them.
    pub fn tensor(self, len: usize, device: &Device) -> Result<Tensor<1>> {
        let values = self.into_vec_of(len)?;
        Ok(Tensor::from_data(TensorData::new(values, [len]), device))
    }

    /// The values, whatever their number.
    pub fn into_vec(self) -> Vec<f32> {
        self.values
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

/// A byte buffer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bytes(pub Vec<u8>);

/// A Burn optimizer's state (its record, in a canonical order: the same state is the same
/// bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct OptimizerState {
    bytes: Vec<u8>,
    key: String,
}

impl OptimizerState {
    /// `optimizer`'s state.
    pub fn of(optimizer: &ModuleOptimizer) -> Result<Self> {
        let fail =
            |e: &dyn std::fmt::Display| GymError::Checkpoint(format!("an optimizer's state: {e}"));
        let bytes = optimizer.into_bytes().map_err(|e| fail(&e))?;
        let bytes = canonical_record(bytes).map_err(|e| fail(&e))?;
        Ok(OptimizerState {
            bytes: bytes.to_vec(),
            key: String::new(),
        })
    }

    /// `fresh` (an optimizer built from the same configuration) with this state. The state
    /// is keyed by parameter ids, which a resumed run restores.
    pub fn load_into(self, fresh: ModuleOptimizer) -> Result<ModuleOptimizer> {
        fresh
            .from_bytes(burn::tensor::Bytes::from_bytes_vec(self.bytes))
            .map_err(|e| GymError::Checkpoint(format!("`{}`: {e}", self.key)))
    }
}

impl StateField for u64 {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.put_u64(key, *self);
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        state.u64(key)
    }

    fn present(key: &str, state: &StateDict) -> bool {
        state.u64(key).is_ok()
    }
}

impl StateField for usize {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        (*self as u64).save(key, state)
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        usize::try_from(u64::load(key, state)?).map_err(|_| {
            GymError::Checkpoint(format!("`{}` does not fit this machine", state.path(key)))
        })
    }

    fn present(key: &str, state: &StateDict) -> bool {
        u64::present(key, state)
    }
}

impl StateField for bool {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        u64::from(*self).save(key, state)
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        Ok(u64::load(key, state)? != 0)
    }

    fn present(key: &str, state: &StateDict) -> bool {
        u64::present(key, state)
    }
}

impl StateField for f64 {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.put_f64(key, *self);
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        state.f64(key)
    }

    fn present(key: &str, state: &StateDict) -> bool {
        u64::present(key, state)
    }
}

impl StateField for Values {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.put_values(key, self.values.clone());
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        Ok(Values {
            values: state.values(key)?.to_vec(),
            key: state.path(key),
        })
    }

    fn present(key: &str, state: &StateDict) -> bool {
        state.values(key).is_ok()
    }
}

impl StateField for Bytes {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.put_bytes(key, self.0.clone());
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        Ok(Bytes(state.bytes(key)?.to_vec()))
    }

    fn present(key: &str, state: &StateDict) -> bool {
        state.bytes(key).is_ok()
    }
}

impl StateField for OptimizerState {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.put_bytes(key, self.bytes.clone());
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        Ok(OptimizerState {
            bytes: state.bytes(key)?.to_vec(),
            key: state.path(key),
        })
    }

    fn present(key: &str, state: &StateDict) -> bool {
        Bytes::present(key, state)
    }
}

/// The state of a component held as a trait object, nested under the field's name.
impl StateField for StateDict {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        state.insert_child(key, self.clone());
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        Ok(state.child(key))
    }

    fn present(key: &str, state: &StateDict) -> bool {
        state.has_child(key)
    }
}

impl<T: StateField> StateField for Option<T> {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        match self {
            Some(value) => value.save(key, state),
            None => Ok(()),
        }
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        if T::present(key, state) {
            T::load(key, state).map(Some)
        } else {
            Ok(None)
        }
    }

    fn present(key: &str, state: &StateDict) -> bool {
        T::present(key, state)
    }
}

/// Element `i` under `key{i}`; read back up to the last one present (an element that stored
/// nothing in between, such as an empty [`StateDict`], reads back as such).
impl<T: StateField> StateField for Vec<T> {
    fn save(&self, key: &str, state: &mut StateDict) -> Result<()> {
        for (i, value) in self.iter().enumerate() {
            value.save(&format!("{key}{i}"), state)?;
        }
        Ok(())
    }

    fn load(key: &str, state: &StateDict) -> Result<Self> {
        let len = state.indices(key).map_or(0, |last| last + 1);
        (0..len)
            .map(|i| T::load(&format!("{key}{i}"), state))
            .collect()
    }

    fn present(key: &str, state: &StateDict) -> bool {
        state.indices(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::record! {
        /// A nested record.
        struct Inner {
            steps: u64,
            lr: f64,
        }
    }

    crate::record! {
        /// Every kind of field.
        struct Outer {
            inner: Inner,
            master: Values,
            fragment: Vec<Inner>,
            optional: Option<Values>,
            flag: bool,
            renamed as "in_flight": Option<Inner>,
            child: StateDict,
        }
    }

    fn sample() -> Outer {
        let mut child = StateDict::new();
        child.put_u64("calls", 9);
        Outer {
            inner: Inner {
                steps: 3,
                lr: 0.1 + 0.2,
            },
            master: Values::from(vec![1.0, -0.0]),
            fragment: vec![Inner { steps: 1, lr: 1.0 }, Inner { steps: 2, lr: 2.0 }],
            optional: None,
            flag: true,
            renamed: Some(Inner { steps: 5, lr: 0.5 }),
            child,
        }
    }

    #[test]
    fn a_record_is_written_under_its_field_names_and_read_back() {
        let state = sample().to_state().unwrap();
        // The keys a hand-written save would have used.
        let mut want = StateDict::new();
        want.put_u64("inner/steps", 3);
        want.put_f64("inner/lr", 0.1 + 0.2);
        want.put_values("master", vec![1.0, -0.0]);
        want.put_u64("fragment0/steps", 1);
        want.put_f64("fragment0/lr", 1.0);
        want.put_u64("fragment1/steps", 2);
        want.put_f64("fragment1/lr", 2.0);
        want.put_u64("flag", 1);
        want.put_u64("in_flight/steps", 5);
        want.put_f64("in_flight/lr", 0.5);
        want.put_u64("child/calls", 9);
        assert_eq!(state, want);
        let back = Outer::from_state(&state).unwrap();
        assert_eq!(back.inner.lr, 0.1 + 0.2);
        assert_eq!(
            back.master.clone().into_vec()[1].to_bits(),
            (-0.0f32).to_bits()
        );
        assert_eq!(back.fragment.len(), 2);
        assert_eq!(back.fragment[1].steps, 2);
        assert!(back.optional.is_none() && back.flag);
        assert_eq!(back.renamed.map(|r| r.steps), Some(5));
        assert_eq!(back.child.u64("calls").unwrap(), 9);
    }

    #[test]
    fn a_missing_field_or_a_wrong_length_names_its_path() {
        let mut state = sample().to_state().unwrap();
        let mut nested = StateDict::new();
        nested.insert_child("module0", state.clone());
        let err = Outer::from_state(&nested.child("module1")).err().unwrap();
        assert!(err.to_string().contains("`module1/inner/steps`"), "{err}");
        let master = Outer::from_state(&nested.child("module0")).unwrap().master;
        let err = master.into_vec_of(3).unwrap_err();
        assert!(
            err.to_string().contains("`module0/master` holds 2 values"),
            "{err}"
        );
        state = StateDict::new();
        let err = Inner::from_state(&state).err().unwrap();
        assert!(err.to_string().contains("`steps`"), "{err}");
    }
}
