//! The conversation state a route reads: the domains that joined it, in join order, and the
//! change that recording hits or loads makes to it (exactly the rows to write).

/// A conversation's remembered state, in the order domains joined it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conversation {
    /// Domains that joined by keyword hit or explicit load, in join order.
    pub members: Vec<Member>,
}

/// One domain remembered by a conversation, by name (so it survives registry reloads: a
/// name that no longer exists is simply skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The domain's name.
    pub domain: String,
    /// Loaded with `LoadToolGroup`.
    pub loaded: bool,
    /// Hit by a keyword or by search on some turn.
    pub hit: bool,
}

/// What a conversation records about a domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mark {
    /// This turn hit it (by keyword or search).
    Hit,
    /// It was loaded explicitly.
    Loaded,
}

/// The members a record changes: each with its position in join order and its flags after
/// the change. Flags only turn on, and new members join at the end, so writing these rows
/// is the whole change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Change {
    /// `(position, member after the change)`, in position order.
    pub rows: Vec<(usize, Member)>,
}

impl Change {
    /// Whether recording changes nothing.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

impl Conversation {
    /// What recording `mark` on these domains would change: existing members get the flag,
    /// new ones join at the end in the given order. Pure; see [`Conversation::apply`].
    pub(crate) fn change<'a>(&self, domains: impl IntoIterator<Item = &'a str>, mark: Mark) -> Change {
        let set = |m: &mut Member| match mark {
            Mark::Hit => m.hit = true,
            Mark::Loaded => m.loaded = true,
        };
        let mut rows: Vec<(usize, Member)> = Vec::new();
        for name in domains {
            if let Some((_, m)) = rows.iter_mut().find(|(_, m)| m.domain == name) {
                set(m);
                continue;
            }
            match self.members.iter().position(|m| m.domain == name) {
                Some(i) => {
                    let mut m = self.members[i].clone();
                    set(&mut m);
                    if m != self.members[i] {
                        rows.push((i, m));
                    }
                }
                None => {
                    let joined = rows.iter().filter(|(i, _)| *i >= self.members.len()).count();
                    let mut m = Member {
                        domain: name.to_string(),
                        loaded: false,
                        hit: false,
                    };
                    set(&mut m);
                    rows.push((self.members.len() + joined, m));
                }
            }
        }
        rows.sort_by_key(|(i, _)| *i);
        Change { rows }
    }

    /// Adopts a change made by [`Conversation::change`] on this same state.
    pub(crate) fn apply(&mut self, change: Change) {
        for (i, m) in change.rows {
            match self.members.get_mut(i) {
                Some(slot) => *slot = m,
                None => self.members.push(m),
            }
        }
    }

    /// Whether a group was loaded explicitly.
    pub(crate) fn is_loaded(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.loaded && m.domain == name)
    }
}
