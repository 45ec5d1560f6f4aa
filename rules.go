package leakybucket

import "slices"

// Rules returns the Bucket's rules, in the order given to New: what an
// HTTP server advertises as its policies (see the httplimit package). The
// slice is a copy.
func (b *Bucket) Rules() []Rule { return slices.Clone(b.cfg.rules) }
