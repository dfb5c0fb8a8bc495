package lua

import (
	_ "embed"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed ceiling_charge.lua
	ceilingChargeSrc string
	//go:embed ceiling_refund.lua
	ceilingRefundSrc string
)

// ceilingCharge increments one shard of a global-ceiling counter and gives
// a new counter its TTL. See ceiling_charge.lua.
var ceilingCharge = redis.NewScript(ceilingChargeSrc)

// ceilingRefund takes back a charge after a denied admission, without ever
// creating a counter. See ceiling_refund.lua.
var ceilingRefund = redis.NewScript(ceilingRefundSrc)
