//! `vidflow hash-password`: the `basic_password_hash` of `[http]`, from a password read on
//! standard input (on a terminal: asked for, without echo, twice), printed on standard output.
//! The password never appears on the command line, where `ps` and the shell's history would
//! show it.

use std::io::{BufRead, IsTerminal, Read, Write};

use crate::spec::PasswordHash;

use super::exit;

/// Runs the subcommand; returns the exit code.
pub(super) fn hash_password() -> u8 {
    let password = if std::io::stdin().is_terminal() {
        ask()
    } else {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map(|_| without_newline(text))
            .map_err(|e| format!("cannot read the password: {e}"))
    };
    let hash = password
        .and_then(|p| {
            if p.is_empty() {
                Err("the password is empty".to_owned())
            } else {
                Ok(p)
            }
        })
        .and_then(|p| PasswordHash::make(&p));
    match hash {
        Ok(hash) => {
            println!("{}", hash.as_str());
            exit::OK
        }
        Err(e) => {
            eprintln!("hash-password: {e}");
            exit::USAGE
        }
    }
}

/// `text` without the one line ending `echo` or a file adds.
fn without_newline(mut text: String) -> String {
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    text
}

/// Asks twice on the terminal, without echo.
fn ask() -> Result<String, String> {
    let first = read_hidden("password: ")?;
    let again = read_hidden("again: ")?;
    if first == again {
        Ok(first)
    } else {
        Err("the two passwords differ".to_owned())
    }
}

/// One line from the terminal, with echo off while it is typed.
fn read_hidden(prompt: &str) -> Result<String, String> {
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let echo = Echo::off();
    let mut line = String::new();
    let read = std::io::stdin().lock().read_line(&mut line);
    drop(echo);
    eprintln!();
    read.map_err(|e| format!("cannot read the password: {e}"))?;
    Ok(without_newline(line))
}

/// The terminal's echo, off while this lives (restored on drop).
struct Echo(Option<libc::termios>);

impl Echo {
    fn off() -> Self {
        let mut saved = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: `saved` is a valid place for one termios, which `tcgetattr` fills; it is
        // read only when the call succeeded.
        let saved = unsafe {
            if libc::tcgetattr(libc::STDIN_FILENO, saved.as_mut_ptr()) != 0 {
                return Self(None);
            }
            saved.assume_init()
        };
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        // SAFETY: `quiet` is an initialised termios that outlives the call.
        let set = unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) };
        Self((set == 0).then_some(saved))
    }
}

impl Drop for Echo {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            // SAFETY: `saved` is the termios `tcgetattr` gave, alive for the call.
            unsafe {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
            }
        }
    }
}
