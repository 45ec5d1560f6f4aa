package txn

import (
	"math/rand/v2"
	"strconv"
	"sync"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// Markers names the marker keys of a Bucket's transactions: a few names,
// each set by one transaction after another, so that a Bucket sets a few
// marker keys per resource, about as many as it has transactions under way
// at once, not one per transaction (the marker of one that takes
// intervals down lives as long as their hashes: see Keep). A name is
// given to one transaction at a time, and back once that transaction is
// known to have run or not to have been sent (Free): one whose outcome
// could not be learned may still run late and set its marker over
// another's, so its name is never given again. Each name is the Bucket's
// own (a random prefix), a key in the resource's slot (keys.Space.Fence).
type Markers struct {
	prefix string
	mu     sync.Mutex
	free   []int // names given back, the latest last
	next   int   // the first name never given
}

// NewMarkers returns the names of a Bucket's markers.
func NewMarkers() *Markers {
	return &Markers{prefix: strconv.FormatUint(rand.Uint64(), 36)}
}

// Mark makes t, if marked and not yet named (by a Markers), set its
// marker in ks under a name that no transaction whose outcome is yet to
// be learned sets. t sets it to a value of its own, which resolve looks
// for. A nil m leaves t's marker as New made it.
func (m *Markers) Mark(t *Txn, ks keys.Space) {
	if m == nil || t.Marker == "" || t.named != 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	i := m.next
	if n := len(m.free); n > 0 {
		i, m.free = m.free[n-1], m.free[:n-1]
	} else {
		m.next++
	}
	t.Marker, t.named = ks.Fence(m.prefix+"."+strconv.Itoa(i)), i+1
}

// Free gives the name of t's marker back, once t is known to have run, or
// not to have been sent: no one reads t's marker any more, and t will not
// set it.
func (m *Markers) Free(t *Txn) {
	if m == nil || t.named == 0 {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.free = append(m.free, t.named-1)
	t.named = 0
}
