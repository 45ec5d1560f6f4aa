package demo

import (
	"time"

	"github.com/leakybucket/leakybucket"
)

// A Call is one call a program made to AllowN and its answer.
type Call struct {
	At     time.Duration // when, since the program's first call, by its clock
	Client string
	Weight int
	Result leakybucket.Result
}

// MostInWindow returns the most weight that the calls admitted for client
// (all of them, if client is empty) hold in any window of length w. calls
// must be in the order of At.
func MostInWindow(calls []Call, client string, w time.Duration) int {
	var admitted []Call
	for _, c := range calls {
		if c.Result.Allowed && (client == "" || c.Client == client) {
			admitted = append(admitted, c)
		}
	}
	most, sum, first := 0, 0, 0
	for _, c := range admitted { // the window that ends with c
		sum += c.Weight
		for admitted[first].At <= c.At-w {
			sum -= admitted[first].Weight
			first++
		}
		most = max(most, sum)
	}
	return most
}
