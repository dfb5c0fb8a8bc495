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

var ceilingCharge = redis.NewScript(ceilingChargeSrc)

// CeilingCharge increments one shard of a global-ceiling counter and gives
// a new counter its TTL. See ceiling_charge.lua.
func CeilingCharge() *redis.Script { return ceilingCharge }

var ceilingRefund = redis.NewScript(ceilingRefundSrc)

// CeilingRefund takes back a charge after a denied admission, without ever
// creating a counter. See ceiling_refund.lua.
func CeilingRefund() *redis.Script { return ceilingRefund }
