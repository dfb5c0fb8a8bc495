package main

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/spillway-go/spillway/examples/internal/demo"
)

// The generate route: a pretend model that "generates" 50 to 500 tokens
// per request and is limited in tokens per minute per client by the
// generate_tokens rule of limits.yaml (cost: response). What a request
// costs is known only once it has run, so the rule holds an estimate when
// the request is admitted and settles it to the tokens used when the
// handler returns: a refund when fewer were used, an extra charge —
// possibly into debt, which makes the client's next requests wait — when
// more were.
const generateRoute = "POST /api/v1/generate"

// generate answers how many tokens it "generated": a number from 50 to 500
// drawn from ?seed=N (any unsigned integer; without it, a server-wide
// sequence), and reports it in the X-Tokens-Used header, which the
// middleware reads as the request's actual cost.
func generate(seq *atomic.Uint64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		seed := seq.Add(1)
		if v := r.URL.Query().Get("seed"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": "seed=" + strconv.Quote(v) + ": want an unsigned integer"})
				return
			}
			seed = n
		}
		tokens := tokensFor(seed)
		w.Header().Set("X-Tokens-Used", strconv.FormatInt(tokens, 10))
		writeJSON(w, http.StatusOK, map[string]any{"seed": seed, "tokens_used": tokens})
	}
}

// tokensFor is the pretend model: seed → 50 to 500 tokens.
func tokensFor(seed uint64) int64 { return demo.Tokens(seed) }
