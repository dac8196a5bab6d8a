// Command lincheck checks that a history of register operations recorded
// by Ember's cluster tests is linearizable, with porcupine's checker.
//
// Input (a JSON file named on the command line): a list of operations
//
//	{"client": 0, "op": "get"|"set", "key": "k1", "value": "v",
//	 "call": ns, "return": ns, "unknown": false}
//
// where a get's value is what it read ("" for nil) and a set's what it
// wrote. An operation whose outcome the client could not learn (a write
// whose connection failed) has "unknown": true: it may have taken effect
// at any time after its call, so it is given no return. Reads that failed
// are left out of the history by the recorder (they change nothing).
//
// Prints "linearizable: N operations" and exits 0, or prints the keys
// whose histories are not and exits 1 (2 when the check timed out).
package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Client  int    `json:"client"`
	Op      string `json:"op"`
	Key     string `json:"key"`
	Value   string `json:"value"`
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
	Unknown bool   `json:"unknown"`
}

type input struct {
	set   bool
	key   string
	value string
}

// A register per key; a missing key reads as "".
var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, o := range history {
			k := o.Input.(input).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return "" },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		i := in.(input)
		if i.set {
			return true, i.value
		}
		return out.(string) == state.(string), state
	},
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		if i.set {
			return fmt.Sprintf("set(%s, %s)", i.key, i.value)
		}
		return fmt.Sprintf("get(%s) -> %s", i.key, out)
	},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: lincheck HISTORY.json")
		os.Exit(64)
	}
	raw, err := os.ReadFile(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(64)
	}
	var ops []op
	if err := json.Unmarshal(raw, &ops); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(64)
	}
	history := make([]porcupine.Operation, 0, len(ops))
	for _, o := range ops {
		ret := o.Return
		if o.Unknown {
			ret = math.MaxInt64
		}
		var output interface{} = ""
		if o.Op == "get" {
			output = o.Value
		}
		history = append(history, porcupine.Operation{
			ClientId: o.Client,
			Input:    input{set: o.Op == "set", key: o.Key, value: o.Value},
			Call:     o.Call,
			Output:   output,
			Return:   ret,
		})
	}
	res := porcupine.CheckOperationsTimeout(model, history, 60*time.Second)
	switch res {
	case porcupine.Ok:
		fmt.Printf("linearizable: %d operations\n", len(history))
	case porcupine.Illegal:
		fmt.Println("NOT linearizable")
		os.Exit(1)
	default:
		fmt.Println("unknown: the check timed out")
		os.Exit(2)
	}
}
