//! Whether the database server answers, as the last calls found (PostgreSQL).
//!
//! A call against a server that is down waits out the busy timeout (for a connection, or for
//! an answer), and one call may run several statements: a settings re-read, then the
//! conversation's. Were every call to wait, `Route` would answer seconds late or run into the
//! request timeout instead of answering from memory (SPEC §12). So once a call finds the
//! server unreachable, calls fail at once with `UNAVAILABLE`, except one per
//! [`PROBE_EVERY`], which tries the server; the first call it answers ends the outage.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

/// How often, while the server is unreachable, a call tries it.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The server's reachability, shared by every call of one daemon.
#[derive(Debug, Default)]
pub(super) struct Reach {
    down: Mutex<Option<Down>>,
}

/// An outage: what the call that found it met, when the server was last tried, and when a
/// call last found it unreachable.
#[derive(Debug)]
struct Down {
    cause: String,
    tried: Instant,
    noted: Instant,
}

impl Down {
    fn refusal(&self) -> Error {
        Error::Unavailable(format!(
            "the database server cannot be reached ({}); it is tried again every {}",
            self.cause,
            humantime::format_duration(PROBE_EVERY)
        ))
    }
}

impl Reach {
    /// Whether a call starting `now` may use the server: always while it is up; while it is
    /// down, once per [`PROBE_EVERY`] (that call tries it).
    ///
    /// # Errors
    /// `Unavailable` naming the cause, while the server is down and was tried less than
    /// [`PROBE_EVERY`] ago.
    pub(super) fn admit(&self, now: Instant) -> Result<()> {
        let mut down = self.lock();
        match down.as_mut() {
            None => Ok(()),
            Some(d) if now.saturating_duration_since(d.tried) >= PROBE_EVERY => {
                d.tried = now;
                Ok(())
            }
            Some(d) => Err(d.refusal()),
        }
    }

    /// Whether a call admitted at `admitted` may run its next statement: not once a call
    /// (itself, or another) found the server unreachable since, so that one call waits out
    /// the busy timeout once at most, not once per statement.
    ///
    /// # Errors
    /// `Unavailable` naming the cause.
    pub(super) fn proceed(&self, admitted: Instant) -> Result<()> {
        match self.lock().as_ref() {
            Some(d) if d.noted >= admitted => Err(d.refusal()),
            _ => Ok(()),
        }
    }

    /// Notes what a call that used the server at `now` found: an outage when it could not
    /// reach it, the end of one when the server answered (also with an error of its own).
    pub(super) fn record<T>(&self, result: &Result<T>, now: Instant) {
        let mut down = self.lock();
        match result {
            Err(e) if unreachable(e) => {
                if down.is_none() {
                    tracing::warn!(
                        error = %e,
                        "the database server cannot be reached; calls fail at once until it answers again"
                    );
                }
                *down = Some(Down {
                    cause: e.to_string(),
                    tried: now,
                    noted: now,
                });
            }
            _ => {
                if down.take().is_some() {
                    tracing::info!("the database server answers again");
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Down>> {
        // Every step leaves a whole value behind, so a poisoned lock's data is good.
        self.down
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Whether an error says the server could not be reached at all: no connection (refused,
/// reset, none free within the busy timeout), no answer in time, or a server shutting down or
/// starting. A statement the server refused or cancelled (a lock wait, a constraint) says it
/// is there.
fn unreachable(e: &Error) -> bool {
    match e {
        // What [`super::bounded`] says of a call the server did not answer in time.
        Error::Unavailable(_) => true,
        Error::Database(e) => match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(db) => db
                .code()
                .is_some_and(|c| c.starts_with("08") || matches!(c.as_ref(), "57P01" | "57P02" | "57P03")),
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused() -> Result<()> {
        Err(Error::Database(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        ))))
    }

    #[test]
    fn a_call_goes_on_until_an_outage_is_found_after_it_was_admitted() {
        let reach = Reach::default();
        let t0 = Instant::now();
        assert!(reach.proceed(t0).is_ok(), "up");
        reach.record(&refused(), t0 + Duration::from_millis(5));
        assert!(reach.proceed(t0).is_err(), "found since it was admitted: at once");
        // The probe, admitted after the outage was found, tries the server.
        let probe = t0 + PROBE_EVERY + Duration::from_millis(5);
        reach.admit(probe).unwrap();
        assert!(reach.proceed(probe).is_ok());
        reach.record(&refused(), probe + Duration::from_millis(10));
        assert!(reach.proceed(probe).is_err(), "its next statement fails at once");
        reach.record(&Ok(()), probe + Duration::from_millis(20));
        assert!(reach.proceed(t0).is_ok(), "back up: every call");
    }

    #[test]
    fn an_unreachable_server_is_tried_once_a_probe_period_until_it_answers() {
        let reach = Reach::default();
        let t0 = Instant::now();
        assert!(reach.admit(t0).is_ok(), "up: every call");
        reach.record(&refused(), t0);
        let err = reach.admit(t0 + Duration::from_millis(10)).unwrap_err();
        assert!(matches!(err, Error::Unavailable(_)), "{err}");
        assert!(err.to_string().contains("cannot be reached"), "{err}");
        assert!(reach.admit(t0 + PROBE_EVERY - Duration::from_millis(1)).is_err());
        // One call a period tries the server; the others meanwhile fail at once.
        let probe = t0 + PROBE_EVERY;
        assert!(reach.admit(probe).is_ok(), "the probe");
        assert!(reach.admit(probe + Duration::from_millis(1)).is_err());
        reach.record(&refused(), probe + Duration::from_millis(500));
        assert!(
            reach.admit(probe + PROBE_EVERY).is_err(),
            "a period from the probe's failure, not its start"
        );
        let next = probe + Duration::from_millis(500) + PROBE_EVERY;
        assert!(reach.admit(next).is_ok(), "the next probe");
        reach.record(&Ok(()), next);
        assert!(reach.admit(next).is_ok(), "up again: every call");
        assert!(reach.admit(next).is_ok());
    }

    #[test]
    fn only_errors_of_an_unreachable_server_start_an_outage() {
        let t0 = Instant::now();
        let cases: Vec<(Result<()>, bool)> = vec![
            (refused(), true),
            (Err(Error::Database(sqlx::Error::PoolTimedOut)), true),
            (Err(Error::Unavailable("did not answer in time".into())), true),
            (Err(Error::Database(sqlx::Error::RowNotFound)), false),
            (Err(Error::Internal("a bug".into())), false),
            (Ok(()), false),
        ];
        for (result, down) in cases {
            let reach = Reach::default();
            reach.record(&result, t0);
            assert_eq!(reach.admit(t0).is_err(), down, "{result:?}");
        }
        // An answer of any kind, an error of its own too, ends an outage.
        let reach = Reach::default();
        reach.record(&refused(), t0);
        reach.record(&Err::<(), _>(Error::Database(sqlx::Error::RowNotFound)), t0);
        assert!(reach.admit(t0).is_ok());
    }
}
