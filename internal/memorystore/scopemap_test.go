package memorystore

import (
	"slices"
	"testing"
)

// Scopes whose keys share a hash, which a 64-bit hash gives about once in
// 2^64, are each found, removed (first, last or between) and listed on
// their own, beside a scope of another hash.
func TestScopeMapCollisions(t *testing.T) {
	keys := []scopeKey{{resource: "r", client: "a"}, {resource: "r", client: "b"}, {resource: "r"}, {resource: "r", client: "a", part: 1}}
	for _, gone := range [][]int{{0}, {3}, {1}, {0, 2}, {3, 1}, {0, 1, 2, 3}} {
		m := scopeMap{}
		other := &scope{key: scopeKey{resource: "other"}, hash: 2}
		m.add(other)
		for _, key := range keys {
			m.add(&scope{key: key, hash: 1})
		}
		for _, i := range gone {
			m.remove(m.find(keys[i], 1))
		}
		var listed []scopeKey
		m.each(func(s *scope) { listed = append(listed, s.key) })
		for i, key := range keys {
			if kept := !slices.Contains(gone, i); (m.find(key, 1) != nil) != kept || slices.Contains(listed, key) != kept {
				t.Errorf("%v gone: %v found %v, listed %v", gone, key, m.find(key, 1) != nil, slices.Contains(listed, key))
			}
		}
		if m.find(other.key, 2) != other || !slices.Contains(listed, other.key) || m.find(other.key, 1) != nil {
			t.Errorf("%v gone: the scope of another hash is lost", gone)
		}
		if want := len(keys) - len(gone) + 1; len(listed) != want {
			t.Errorf("%v gone: %d scopes listed, want %d", gone, len(listed), want)
		}
	}
}
