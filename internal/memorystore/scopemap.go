package memorystore

// scopeMap is a shard's scopes by the hash of their key (Counts.keyOf):
// a map of 8-byte keys, hashed and compared in a few instructions, where
// a map by key hashed two strings and compared them, in slots five times
// the size and so more often out of cache. Scopes whose keys share a hash
// are chained from the one in the map (scope.same).
type scopeMap map[uint64]*scope

// find returns the scope of key, whose hash is h; nil if none.
func (m scopeMap) find(key scopeKey, h uint64) *scope {
	for s := m[h]; s != nil; s = s.same {
		if s.key == key {
			return s
		}
	}
	return nil
}

// add adds s, a scope of a key m has no scope of.
func (m scopeMap) add(s *scope) {
	s.same = m[s.hash]
	m[s.hash] = s
}

// remove removes s, a scope of m.
func (m scopeMap) remove(s *scope) {
	first := m[s.hash]
	switch {
	case first != s:
		for first.same != s {
			first = first.same
		}
		first.same = s.same
	case s.same != nil:
		m[s.hash] = s.same
	default:
		delete(m, s.hash)
	}
	s.same = nil
}

// each calls f with each scope of m; f may remove it.
func (m scopeMap) each(f func(s *scope)) {
	for _, first := range m {
		for s := first; s != nil; {
			next := s.same
			f(s)
			s = next
		}
	}
}
