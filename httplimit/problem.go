package httplimit

import (
	"encoding/json"
	"net/http"
)

// ProblemType is the problem type of draft-ietf-httpapi-ratelimit-headers
// for a request that exceeded one or more quota policies.
const ProblemType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is the body of ProblemDetails (RFC 9457).
type problem struct {
	Type     string   `json:"type"`
	Title    string   `json:"title"`
	Status   int      `json:"status"`
	Detail   string   `json:"detail"`
	Violated []string `json:"violated-policies"`
}

// ProblemDetails is a denied handler (see WithProblemDetails): it answers
// 429 Too Many Requests with an application/problem+json body of type
// ProblemType, whose "violated-policies" names the policies that denied
// (DeniedPolicies) and whose "detail" repeats Retry-After:
//
//	{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded",
//	 "title":"Request cannot be satisfied as assigned quota has been exceeded",
//	 "status":429,"detail":"retry after 10 s","violated-policies":["per-client-10s"]}
//
// or, for a request whose cost is above a quota, which has no
// Retry-After, says that it can never be served: "detail":"the request
// costs more than the quota: it can never be served".
func ProblemDetails(w http.ResponseWriter, r *http.Request) {
	body := problem{
		Type:     ProblemType,
		Title:    "Request cannot be satisfied as assigned quota has been exceeded",
		Status:   http.StatusTooManyRequests,
		Detail:   denial(w, r),
		Violated: DeniedPolicies(r.Context()),
	}
	if body.Violated == nil {
		body.Violated = []string{}
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusTooManyRequests)
	_ = json.NewEncoder(w).Encode(body)
}
