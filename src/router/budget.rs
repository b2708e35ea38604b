//! The budget (SPEC §9): which whole domains an answer over `max_tools` or `token_budget`
//! leaves out. Pure: the same inputs give the same answer.
//!
//! Over budget, domains are dropped one at a time until the answer fits: `FALLBACK` domains
//! (most tokens first, then by name), then `SEARCH` domains (lowest score first, then by
//! name), then `STICKY` domains (the earliest joined first). `CORE`, `KEYWORD` and `LOADED`
//! domains and the meta-tools are never dropped; when they alone are over budget the answer
//! is sent anyway.

use std::cmp::Ordering;

use super::{Decision, Reason};
use crate::registry::DomainId;

/// The limits of one answer; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// At most this many tools (meta-tools included).
    pub max_tools: Option<u64>,
    /// At most this many tokens (meta-tools included).
    pub token_budget: Option<u64>,
}

impl Limits {
    /// The limits a `Route` call gets: the request's (`max_tools`, `token_budget`; 0 = not
    /// given), else its profile's, else the server's; a profile's limit is also a ceiling
    /// the request cannot raise.
    pub fn resolve(
        request: (u32, u32),
        profile: Option<(Option<u32>, Option<u32>)>,
        server: Limits,
    ) -> Limits {
        let (profile_tools, profile_tokens) = profile.unwrap_or_default();
        let pick = |asked: u32, ceiling: Option<u32>, default: Option<u64>| -> Option<u64> {
            let ceiling = ceiling.filter(|&c| c > 0).map(u64::from);
            match (asked, ceiling) {
                (0, None) => default,
                (0, Some(c)) => Some(c),
                (n, None) => Some(u64::from(n)),
                (n, Some(c)) => Some(u64::from(n).min(c)),
            }
        };
        Limits {
            max_tools: pick(request.0, profile_tools, server.max_tools),
            token_budget: pick(request.1, profile_tokens, server.token_budget),
        }
    }
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
    /// The conversation loaded it (SPEC §9: never dropped), whatever its reason.
    pub loaded: bool,
    /// What it costs.
    pub cost: Cost,
}

/// Whether a domain may be dropped, and in which round (lower goes first).
fn round(c: &Candidate) -> Option<u8> {
    match c.reason {
        _ if c.loaded => None,
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
        .filter(|&i| round(&candidates[i]).is_some())
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

/// A domain the budget left out of an answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropped {
    /// The domain.
    pub domain: DomainId,
    /// Why it would have been in the answer.
    pub reason: Reason,
    /// What it would have cost.
    pub cost: Cost,
}

/// Fits a decision to `limits`: removes the domains [`select`] drops from
/// `decision.domains` and returns them in the order they were dropped. `fixed` is what the
/// meta-tools cost, `cost` what each domain's tools cost.
pub fn fit(
    decision: &mut Decision,
    fixed: Cost,
    cost: impl Fn(DomainId) -> Cost,
    limits: Limits,
) -> Vec<Dropped> {
    let candidates: Vec<Candidate> = decision
        .domains
        .iter()
        .map(|inc| Candidate {
            domain: inc.domain,
            reason: inc.reason,
            score: decision.search_hit(inc.domain).map_or(0.0, |h| h.score),
            loaded: inc.loaded,
            cost: cost(inc.domain),
        })
        .collect();
    let out = select(fixed, &candidates, limits);
    let mut keep = vec![true; candidates.len()];
    for &i in &out {
        keep[i] = false;
    }
    let mut i = 0;
    decision.domains.retain(|_| {
        i += 1;
        keep[i - 1]
    });
    out.iter()
        .map(|&i| Dropped {
            domain: candidates[i].domain,
            reason: candidates[i].reason,
            cost: candidates[i].cost,
        })
        .collect()
}

/// Which of two droppable domains goes first. Ties that remain (equal reasons, tokens,
/// scores and names cannot happen within one answer) fall back to answer position.
fn drop_order(a: &Candidate, ia: usize, b: &Candidate, ib: usize) -> Ordering {
    let (ra, rb) = (round(a), round(b));
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
            loaded: false,
            cost: Cost { tools, tokens },
        }
    }

    #[test]
    fn limits_come_from_the_request_then_the_profile_then_the_server() {
        let server = Limits {
            max_tools: Some(128),
            token_budget: None,
        };
        let l = |tools, tokens| Limits {
            max_tools: tools,
            token_budget: tokens,
        };
        type ProfileLimits = Option<(Option<u32>, Option<u32>)>;
        let cases: &[((u32, u32), ProfileLimits, Limits)] = &[
            ((0, 0), None, server),
            ((10, 500), None, l(Some(10), Some(500))),
            ((200, 0), None, l(Some(200), None)),
            ((0, 0), Some((Some(20), None)), l(Some(20), None)),
            ((0, 0), Some((None, Some(900))), l(Some(128), Some(900))),
            ((10, 0), Some((Some(20), None)), l(Some(10), None)),
            ((50, 0), Some((Some(20), None)), l(Some(20), None)),
            ((0, 2000), Some((None, Some(900))), l(Some(128), Some(900))),
        ];
        for &(request, profile, want) in cases {
            assert_eq!(
                Limits::resolve(request, profile, server),
                want,
                "{request:?} {profile:?}"
            );
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

    #[test]
    fn a_loaded_domain_is_kept_whatever_reason_comes_first() {
        let loaded = |c: Candidate| Candidate { loaded: true, ..c };
        let cands = [
            loaded(c(0, Reason::Search, 5, 50, 0.5)),
            c(1, Reason::Search, 5, 50, 2.0),
            loaded(c(2, Reason::Loaded, 5, 50, 0.0)),
        ];
        let none = Limits {
            max_tools: Some(0),
            token_budget: None,
        };
        assert_eq!(select(Cost::default(), &cands, none), vec![1]);
    }

    #[test]
    fn fit_removes_exactly_the_dropped_domains_and_keeps_the_order_of_the_rest() {
        let included = |d: usize, reason: Reason| super::super::Included {
            domain: DomainId::at(d),
            reason,
            matched: 0..0,
            loaded: false,
        };
        let mut decision = Decision {
            meta_tool: true,
            search_tool: false,
            domains: vec![
                included(0, Reason::Core),
                included(3, Reason::Fallback),
                included(1, Reason::Keyword),
                included(2, Reason::Fallback),
            ],
            keywords: Vec::new(),
            search: Vec::new(),
            fallback: false,
            new_hits: Vec::new(),
        };
        // Domain d has d + 1 tools of 10 tokens each.
        let cost = |d: DomainId| Cost {
            tools: d.index() as u64 + 1,
            tokens: 10 * (d.index() as u64 + 1),
        };
        // 11 tools in all; dropping the fallback domain with the most tokens (3) leaves 7.
        let limits = Limits {
            max_tools: Some(7),
            token_budget: None,
        };
        let dropped = fit(&mut decision, Cost { tools: 1, tokens: 5 }, cost, limits);
        assert_eq!(
            dropped,
            vec![Dropped {
                domain: DomainId::at(3),
                reason: Reason::Fallback,
                cost: Cost { tools: 4, tokens: 40 },
            }]
        );
        let left: Vec<usize> = decision.domains.iter().map(|i| i.domain.index()).collect();
        assert_eq!(left, vec![0, 1, 2]);
    }
}
