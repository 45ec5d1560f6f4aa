package txn

import (
	"iter"
	"slices"
	"strconv"
	"strings"

	"github.com/leakybucket/leakybucket/internal/keys"
)

// Resend returns cmds, take-backs that t carried, as a transaction to send
// after Resolve found that t did not run. The verdict can be wrong: t may
// run late. So where cmds take intervals down, the resend changes none:
// it writes what cmds add to each hash's intervals (a take-back's less
// than 0, a move's more) as a pending field of the hash named after t
// (pendingField), which reads add, and which t, if it runs late, deletes
// as it changes the intervals itself (see cancels). It applies only where
// t's marker does not say t ran, under WATCH of the marker: t running
// between the read and the EXEC aborts it, and it is sent again, to find
// the marker. So the intervals are changed once in any order, and a
// resend may be sent as often as it takes. Its shrinks of a total are
// left out (Resent); its other commands (a move's addition to a total)
// are sent as they are: should t run late too, they count twice, which
// errs on the side of denying.
func (t *Txn) Resend(ks keys.Space, cmds [][]any) *Txn { return t.resend(ks, cmds, nil) }

func (t *Txn) resend(ks keys.Space, cmds [][]any, guards []Guard) *Txn {
	r := New(ks, true)
	r.Cmds, r.Guards = pending(t.mark, 0, cmds), make([]Guard, len(guards))
	for i, g := range guards {
		r.Guards[i] = Guard{Key: g.Key, Field: g.Field, Want: g.Want, Cmds: pending(t.mark, i+1, g.Cmds)}
	}
	r.Undoes, r.undoMark = t.Undoes, t.undoMark
	r.resends, r.resendMark = t.Marker, t.mark
	return r
}

// change reads cmd as a change of an interval: HINCRBY of a hash's field
// other than its total, by n, not 0.
func change(cmd []any) (key any, field string, n int, ok bool) {
	n, isInt := cmd[len(cmd)-1].(int)
	if !isInt || n == 0 || len(cmd) != 4 || cmd[0] != "hincrby" || cmd[2] == TotalField {
		return nil, "", 0, false
	}
	return cmd[1], ReplyString(cmd[2]), n, true
}

// takesDown reports whether cmds take an interval down: then their
// changes of intervals are resent as pending (see Resend).
func takesDown(cmds [][]any) bool {
	return slices.ContainsFunc(cmds, func(cmd []any) bool {
		_, _, n, ok := change(cmd)
		return ok && n < 0
	})
}

// pending returns cmds, the commands of group of the transaction marked
// mark, as its resend sends them: if they take an interval down, each
// hash's changes of intervals as one HSET of its pending field, where its
// first change was (a DropIfMade after it drops a hash it makes); and no
// shrink of a total.
func pending(mark string, group int, cmds [][]any) [][]any {
	if !takesDown(cmds) {
		return Resent(cmds)
	}
	out := make([][]any, 0, len(cmds))
	at := map[any]int{} // by hash: its HSET's index in out
	for _, cmd := range Resent(cmds) {
		key, field, n, ok := change(cmd)
		if !ok {
			out = append(out, cmd)
			continue
		}
		pair := field + ":" + strconv.Itoa(n)
		if i, seen := at[key]; seen {
			out[i][3] = out[i][3].(string) + "," + pair
			continue
		}
		at[key] = len(out)
		out = append(out, []any{"hset", key, pendingField(mark, group), pair})
	}
	return out
}

// cancels returns the commands that delete the pending fields a resend of
// cmds, group of t, would write (see Resend): t runs them with cmds, so
// that, run after its resend, t changes the intervals in its stead. None
// for a transaction that is not marked (nothing resends it as such) or
// takes no interval down; else one per hash whose intervals cmds change
// (a decision's own writes included: a resend carries only the
// take-backs, but deleting a field it never wrote does nothing).
func (t *Txn) cancels(group int, cmds [][]any) [][]any {
	if t.Marker == "" || !takesDown(cmds) {
		return nil
	}
	var out [][]any
	var field string
	for _, cmd := range cmds {
		key, _, _, ok := change(cmd)
		if !ok || slices.ContainsFunc(out, func(c []any) bool { return c[1] == key }) {
			continue
		}
		if field == "" {
			field = pendingField(t.mark, group)
		}
		out = append(out, []any{"hdel", key, field})
	}
	return out
}

// TotalField is the field of a Windows hash that holds the total of its
// epoch's intervals, which a decision far from its limits is judged on:
// it must never be less than what the intervals hold.
const TotalField = "t"

// Resent returns cmds, to send again after the transaction that carried
// them did not run or was found not to have run, without its shrinks: the
// commands that take a total (TotalField) down. A verdict that a
// transaction did not run can be wrong (its bytes reached Redis after the
// verdict, and it ran late): a total taken down again would then be taken
// down twice, and be less than its intervals hold (a resend takes those
// down once, see Resend). Left up, it is more, which only errs on the
// side of denying.
func Resent(cmds [][]any) [][]any {
	out := make([][]any, 0, len(cmds))
	for _, cmd := range cmds {
		if n, ok := cmd[len(cmd)-1].(int); !ok || n >= 0 || len(cmd) != 4 || cmd[0] != "hincrby" || cmd[2] != TotalField {
			out = append(out, cmd)
		}
	}
	return out
}

// A resend (see Again) never changes an interval: it writes what it would
// add to each hash's intervals (less than 0 for a take-back) as one
// pending field of that hash, named after the transaction that first
// carried the take-backs, which reads add to the intervals (Pending). That
// transaction, if it runs late, deletes the field as it changes the
// intervals itself: either way they are changed once.
const pendingPrefix = "p:"

// pendingField names the pending field of the shrinks of group (0 for a
// transaction's commands, i+1 for its guard i's) of the transaction
// marked mark.
func pendingField(mark string, group int) string {
	return pendingPrefix + mark + "." + strconv.Itoa(group)
}

// IsPending reports whether a hash's field is a pending one: its value
// is read with Pending.
func IsPending(field string) bool { return strings.HasPrefix(field, pendingPrefix) }

// Pending reads the value of a pending field: each interval's field and
// the weight to add to it (less than 0 to take some away), never 0. A
// pair that is not so is not ours, and skipped.
func Pending(value string) iter.Seq2[string, int] {
	return func(yield func(string, int) bool) {
		for pair := range strings.SplitSeq(value, ",") {
			field, weight, ok := strings.Cut(pair, ":")
			n, err := strconv.Atoi(weight)
			if ok && err == nil && n != 0 && !yield(field, n) {
				return
			}
		}
	}
}
