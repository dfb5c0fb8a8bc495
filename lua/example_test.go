package lua_test

import (
	"fmt"

	"github.com/spillway-go/spillway/lua"
)

// Script finds a script by the name of its file; run it with go-redis
// (Script.Run: EVALSHA, EVAL on NOSCRIPT).
func ExampleScript() {
	fmt.Println(lua.Script("ratelimit_hold") != nil)
	// Output:
	// true
}
