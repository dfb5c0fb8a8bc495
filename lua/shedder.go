package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

//go:embed shedder_fleet.lua
var shedderFleetSrc string

// shedderFleet reports one server's in-flight work per priority and returns
// the fleet's (the fleet usage load shedder). See shedder_fleet.lua for
// KEYS, ARGV and the reply.
var shedderFleet = redis.NewScript(shedderFleetSrc)
