package lock

import "errors"

// The errors of Run; the root package re-exports them as
// ErrLockNotObtained and ErrLockExpired, with their documentation.
var (
	ErrNotObtained = errors.New("leakybucket: lock not obtained")
	ErrExpired     = errors.New("leakybucket: lock expired before the decision was written")
)
