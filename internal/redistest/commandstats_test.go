package redistest

import "testing"

func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_set:calls=3,usec=12,usec_per_call=4.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=55,usec_per_call=55.00,rejected_calls=0,failed_calls=0\r\n"
	got := CommandStats(info)
	if len(got) != 2 || got["set"] != (CommandStat{Calls: 3, Usec: 12}) || got["config|resetstat"] != (CommandStat{Calls: 1, Usec: 55}) {
		t.Fatalf("CommandStats = %+v", got)
	}
}
