//! An accept loop's pause, shared by the gRPC listener (`server`) and the metrics endpoint.

/// An accept loop's pause while the process is out of file descriptors or kernel memory:
/// retrying at once fails again, so the loop waits, 10 ms doubling to 1 s, and logs once per
/// streak (and once when accepting works again) instead of spinning and filling the log.
#[derive(Debug)]
pub(crate) struct AcceptPause {
    /// How the listener's log lines begin ("" for the gRPC listener).
    listener: &'static str,
    delay: std::time::Duration,
    failing: bool,
}

impl AcceptPause {
    const FIRST: std::time::Duration = std::time::Duration::from_millis(10);
    const LONGEST: std::time::Duration = std::time::Duration::from_secs(1);

    pub(crate) fn new(listener: &'static str) -> AcceptPause {
        AcceptPause {
            listener,
            delay: Self::FIRST,
            failing: false,
        }
    }

    /// An accept succeeded: a streak of failures, if any, is over.
    pub(crate) fn accepted(&mut self) {
        if self.failing {
            tracing::info!("{}accepting connections again", self.listener);
            (self.delay, self.failing) = (Self::FIRST, false);
        }
    }

    /// An accept failed: how long to pause before the next one, or `None` when only that
    /// connection was lost (reset before it was accepted, and the like).
    pub(crate) fn failed(&mut self, e: &std::io::Error) -> Option<std::time::Duration> {
        if !out_of_resources(e) {
            tracing::debug!(error = %e, "{}accept failed", self.listener);
            return None;
        }
        if !self.failing {
            self.failing = true;
            tracing::error!(
                error = %e,
                "{}cannot accept connections: out of file descriptors; pausing the accept loop \
                 (raise the open-files limit, or lower the number of idle connections)",
                self.listener
            );
        }
        let pause = self.delay;
        self.delay = (self.delay * 2).min(Self::LONGEST);
        Some(pause)
    }
}

/// Whether an accept failed for lack of file descriptors or kernel memory.
fn out_of_resources(e: &std::io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(
            e.raw_os_error(),
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}
