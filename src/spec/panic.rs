//! The text of a caught panic's payload.

use std::any::Any;

/// The message a panic was raised with (`panic!("...")` gives a `&str` or a `String`), or
/// `None` for another payload (`panic_any`).
pub fn panic_text(payload: &(dyn Any + Send)) -> Option<String> {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
}
