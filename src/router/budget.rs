//! The budget (SPEC §9): which whole domains an answer over `max_tools` or `token_budget`
//! leaves out. Pure: the same inputs give the same answer.
//!
//! Over budget, domains are dropped one at a time until the answer fits: `FALLBACK` domains
//! (most tokens first, then by name), then `SEARCH` domains (lowest score first, then by
//! name), then `STICKY` domains (the earliest joined first). `CORE`, `KEYWORD` and `LOADED`
//! domains and the meta-tools are never dropped; when they alone are over budget the answer
//! is sent anyway.

use std::cmp::Ordering;

use super::Reason;
use crate::registry::DomainId;

/// The limits of one answer; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// At most this many tools (meta-tools included).
    pub max_tools: Option<u64>,
    /// At most this many tokens (meta-tools included).
    pub token_budget: Option<u64>,
}

/// What a part of an answer costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    /// Its tools.
    pub tools: u64,
    /// Their tokens in the requested format.
    pub tokens: u64,
}

impl Cost {
    fn fits(self, limits: Limits) -> bool {
        limits.max_tools.is_none_or(|m| self.tools <= m)
            && limits.token_budget.is_none_or(|b| self.tokens <= b)
    }
}

/// One included domain, in answer order (for sticky domains that is the order they joined
/// the conversation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The domain (id order is name order).
    pub domain: DomainId,
    /// Why it is in the answer.
    pub reason: Reason,
    /// With [`Reason::Search`]: its score; otherwise unused.
    pub score: f32,
    /// What it costs.
    pub cost: Cost,
}

/// Whether a reason's domains may be dropped, and in which round (lower goes first).
fn round(reason: Reason) -> Option<u8> {
    match reason {
        Reason::Fallback => Some(0),
        Reason::Search => Some(1),
        Reason::Sticky => Some(2),
        Reason::Core | Reason::Keyword | Reason::Loaded => None,
    }
}

/// The positions in `candidates` of the domains to drop, in the order they were dropped:
/// none when the answer (`fixed`, the meta-tools, plus every candidate) fits `limits`.
pub fn select(fixed: Cost, candidates: &[Candidate], limits: Limits) -> Vec<usize> {
    let mut total = candidates.iter().fold(fixed, |acc, c| Cost {
        tools: acc.tools + c.cost.tools,
        tokens: acc.tokens + c.cost.tokens,
    });
    if total.fits(limits) {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..candidates.len())
        .filter(|&i| round(candidates[i].reason).is_some())
        .collect();
    order.sort_by(|&a, &b| drop_order(&candidates[a], a, &candidates[b], b));
    let mut dropped = Vec::new();
    for i in order {
        if total.fits(limits) {
            break;
        }
        total.tools -= candidates[i].cost.tools;
        total.tokens -= candidates[i].cost.tokens;
        dropped.push(i);
    }
    dropped
}

/// Which of two droppable domains goes first. Ties that remain (equal reasons, tokens,
/// scores and names cannot happen within one answer) fall back to answer position.
fn drop_order(a: &Candidate, ia: usize, b: &Candidate, ib: usize) -> Ordering {
    let (ra, rb) = (round(a.reason), round(b.reason));
    ra.cmp(&rb).then_with(|| match a.reason {
        Reason::Fallback => b.cost.tokens.cmp(&a.cost.tokens).then(a.domain.cmp(&b.domain)),
        Reason::Search => a.score.total_cmp(&b.score).then(a.domain.cmp(&b.domain)),
        _ => ia.cmp(&ib),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(domain: usize, reason: Reason, tools: u64, tokens: u64, score: f32) -> Candidate {
        Candidate {
            domain: DomainId::at(domain),
            reason,
            score,
            cost: Cost { tools, tokens },
        }
    }

    #[test]
    fn nothing_is_dropped_when_the_answer_fits() {
        let cands = [c(0, Reason::Fallback, 10, 100, 0.0)];
        let fixed = Cost { tools: 2, tokens: 50 };
        assert!(select(fixed, &cands, Limits::default()).is_empty());
        let exact = Limits {
            max_tools: Some(12),
            token_budget: Some(150),
        };
        assert!(select(fixed, &cands, exact).is_empty(), "exactly the limit fits");
    }

    #[test]
    fn fallback_then_search_then_sticky_in_their_own_orders() {
        let cands = [
            c(0, Reason::Core, 5, 50, 0.0),
            c(7, Reason::Sticky, 1, 10, 0.0),
            c(3, Reason::Sticky, 1, 10, 0.0),
            c(4, Reason::Search, 1, 10, 2.0),
            c(5, Reason::Search, 1, 10, 1.0),
            c(1, Reason::Keyword, 1, 10, 0.0),
            c(6, Reason::Fallback, 1, 10, 0.0),
            c(2, Reason::Fallback, 1, 10, 0.0),
            c(8, Reason::Fallback, 1, 30, 0.0),
        ];
        let all = select(
            Cost::default(),
            &cands,
            Limits {
                max_tools: Some(0),
                token_budget: None,
            },
        );
        // Fallback: most tokens (8), then by name (2 before 6); search: lowest score (5, then
        // 4); sticky: earliest joined (7 joined before 3).
        assert_eq!(all, vec![8, 7, 6, 4, 3, 1, 2]);
        let some = select(
            Cost::default(),
            &cands,
            Limits {
                max_tools: None,
                token_budget: Some(100),
            },
        );
        assert_eq!(some, vec![8, 7, 6], "stops as soon as it fits");
    }
}
