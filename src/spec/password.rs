//! Passwords vidflow checks rather than sends (the HTTP endpoint's basic auth): kept only as a
//! salted, deliberately slow hash, a PHC string such as `$argon2id$v=19$m=19456,t=2,p=1$SALT$HASH`
//! (Argon2id, RFC 9106, through RustCrypto's `argon2` and `password-hash` crates: a maintained
//! implementation, never our own). `vidflow hash-password` makes one with a fresh random salt and
//! the `argon2` crate's defaults (19 MiB, 2 passes, 1 lane: OWASP's recommendation); a file
//! that leaks gives an attacker one expensive guess per try, per salt.
//!
//! Checking one costs tens of milliseconds and its memory on purpose: the caller decides on
//! which thread (the HTTP endpoint checks off its event loop, `daemon/http/verify.rs`).

use std::fmt;

use argon2::password_hash::{PasswordHash as Phc, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params};
use password_hash::rand_core::OsRng;

/// The most memory a hash given to vidflow may make each check use: 256 MiB (its `m=`, in KiB).
/// More would let one request take that much of a camera box's memory.
const MAX_MEMORY_KIB: u32 = 256 * 1024;

/// The most passes (`t=`) a hash may ask for, for the same reason in time.
const MAX_PASSES: u32 = 64;

/// A checked Argon2 PHC string.
#[derive(Clone, PartialEq, Eq)]
pub struct PasswordHash(String);

impl PasswordHash {
    /// Takes `phc` if it is an Argon2 PHC string whose costs are within bounds. The message
    /// never quotes it (a hash is not the password, but need not be printed either).
    pub fn parse(phc: &str) -> Result<Self, String> {
        let phc = phc.trim();
        let parsed = Phc::new(phc).map_err(|e| {
            format!("not a PHC string like \"$argon2id$v=19$m=19456,t=2,p=1$...\" ({e})")
        })?;
        if Algorithm::try_from(parsed.algorithm).is_err() {
            return Err(format!(
                "\"${}$...\" is not an Argon2 hash (argon2id, argon2i or argon2d)",
                parsed.algorithm
            ));
        }
        if parsed.hash.is_none() || parsed.salt.is_none() {
            return Err("the hash has no salt or no output".to_owned());
        }
        let params = Params::try_from(&parsed).map_err(|e| format!("bad parameters ({e})"))?;
        if params.m_cost() > MAX_MEMORY_KIB || params.t_cost() > MAX_PASSES {
            return Err(format!(
                "its cost (m={}, t={}) is over the most vidflow checks (m={MAX_MEMORY_KIB}, \
                 t={MAX_PASSES}); make one with vidflow hash-password",
                params.m_cost(),
                params.t_cost()
            ));
        }
        Ok(Self(phc.to_owned()))
    }

    /// Hashes `password` with a fresh random salt and the default costs.
    pub fn make(password: &str) -> Result<Self, String> {
        let salt = SaltString::generate(&mut OsRng);
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| Self(h.to_string()))
            .map_err(|e| format!("cannot hash the password: {e}"))
    }

    /// Whether `password` is the one hashed: slow on purpose (see the module header).
    pub fn verify(&self, password: &str) -> bool {
        // Parsed when taken: this parse does not fail.
        Phc::new(&self.0).is_ok_and(|phc| {
            Argon2::default()
                .verify_password(password.as_bytes(), &phc)
                .is_ok()
        })
    }

    /// The PHC string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for PasswordHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PasswordHash(...)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_made_hash_is_salted_argon2id_and_verifies_only_its_password() {
        let a = PasswordHash::make("hunter2").unwrap();
        let b = PasswordHash::make("hunter2").unwrap();
        assert!(
            a.as_str().starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{a:?}"
        );
        assert!(!a.as_str().contains("hunter2"));
        // A fresh salt each time: the same password, another hash.
        assert_ne!(a, b);
        assert!(a.verify("hunter2") && b.verify("hunter2"));
        assert!(!a.verify("hunter3") && !a.verify("") && !a.verify("hunter2 "));
        assert_eq!(PasswordHash::parse(a.as_str()), Ok(a));
    }

    #[test]
    fn anything_but_a_bounded_argon2_phc_string_is_refused_without_quoting_it() {
        let sha = "f52fbd32b2b3b86ff88ef6c490628285f482af15ddcb29541f94bcf526a3f6c7";
        for (text, want) in [
            (sha, "not a PHC string"),
            ("", "not a PHC string"),
            (
                "$scrypt$ln=16,r=8,p=1$aM15713r3Xsvxbi31lqr1Q$nFNh2CVHVjNldFVKDHDlm4CbdRSCdEBsjjJxD+iCs5E",
                "not an Argon2 hash",
            ),
            ("$argon2id$v=19$m=19456,t=2,p=1", "no salt"),
            (
                "$argon2id$v=19$m=4194304,t=2,p=1$c2FsdHNhbHRzYWx0$RdescudvJCsgt3ub+b+dWRWJTmaaJObG",
                "over the most",
            ),
        ] {
            let e = PasswordHash::parse(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
            assert!(text.is_empty() || !e.contains(text), "{e}");
        }
    }
}
