// beevik-ntp queries an NTP server with github.com/beevik/ntp, an NTP client library independent
// of chime, and prints what the library makes of each reply: one line of JSON per query, with the
// clock offset and round trip in seconds and the header's stratum and leap indicator. It exits
// non-zero, naming the cause, when a query fails or the library rejects a reply (Validate).
//
// Usage: beevik-ntp [-count N] [-timeout D] HOST:PORT
//
// scripts/setup builds it into /opt/chime-peers/bin; chime's tests use it as a client of chimed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/beevik/ntp"
)

type result struct {
	Offset  float64 `json:"offset"`
	RTT     float64 `json:"rtt"`
	Stratum uint8   `json:"stratum"`
	Leap    uint8   `json:"leap"`
	Version int     `json:"version"`
}

func main() {
	count := flag.Int("count", 1, "queries to send, one after another")
	timeout := flag.Duration("timeout", time.Second, "how long to wait for each reply")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: beevik-ntp [-count N] [-timeout D] HOST:PORT")
		os.Exit(2)
	}
	server := flag.Arg(0)
	out := json.NewEncoder(os.Stdout)
	for i := 0; i < *count; i++ {
		r, err := ntp.QueryWithOptions(server, ntp.QueryOptions{Timeout: *timeout})
		if err == nil {
			err = r.Validate()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "beevik-ntp: %s, query %d: %v\n", server, i+1, err)
			os.Exit(1)
		}
		out.Encode(result{
			Offset:  r.ClockOffset.Seconds(),
			RTT:     r.RTT.Seconds(),
			Stratum: r.Stratum,
			Leap:    uint8(r.Leap),
			Version: r.Version,
		})
	}
}
