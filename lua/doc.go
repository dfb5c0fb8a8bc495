// Package lua holds spillway's Redis scripts: one .lua file per script,
// embedded with go:embed. The package exports one func and no
// variables: Script returns a script by the name of its file
// (Script("ratelimit_hold")), one *redis.Script per script, built once
// (run with go-redis Script.Run: EVALSHA, with an EVAL fallback on
// NOSCRIPT). Each file opens
// with its contract: KEYS, ARGV, the reply, and what it writes. Scripts
// touch only the keys in KEYS, so they are safe on Redis Cluster as long as
// a call's keys share a hash tag.
//
// Each building block declares its scripts in its own file here
// (ratelimit.go, concurrency.go, …). No Go enum's ordinal crosses into a
// script: an algorithm goes in ARGV by its config name, and the numbers
// the scripts and Go share (the settle replies, the slots of the hold
// helpers' tables) are named once in ratelimit_holds.lua and written as
// numbers when the script is built, at no cost when it runs.
//
// The blocks run these scripts themselves; what happens when Redis fails
// or is slow is each block's to say (see its package doc). Script.Run returns what go-redis returns: a reply,
// Redis's error, or the network's. A caller needs this package only to
// read a script's contract or to run one by hand.
//
// The shortest use:
//
//	script := lua.Script("ratelimit_hold") // nil for a name that is not a script
//	fmt.Println(script.Hash())            // the SHA1 that EVALSHA sends
package lua
