package main

import (
	"fmt"
	"math"
	"strconv"
)

// prefillLoadScaleFlag is --prefill-load-scale: "auto", each worker's
// scale fitted from its measured timing (sched.CostParams'
// AutoPrefillLoadScale), or a number that pins one for all.
type prefillLoadScaleFlag struct {
	scale *float64
	auto  *bool
}

const prefillLoadScaleUsage = "weight of the prefill term against the decode term in the cost: `auto` derives it from each worker's timing as the router observes it and applies the workers' median (kvfast_prefill_load_scale; see docs/routing.md), a number pins it"

func (f prefillLoadScaleFlag) String() string {
	switch {
	case f.auto == nil:
		return ""
	case *f.auto:
		return "auto"
	}
	return strconv.FormatFloat(*f.scale, 'g', -1, 64)
}

func (f prefillLoadScaleFlag) Set(v string) error {
	if v == "auto" {
		*f.auto = true
		return nil
	}
	x, err := strconv.ParseFloat(v, 64)
	if err != nil || x < 0 || math.IsNaN(x) || math.IsInf(x, 0) {
		return fmt.Errorf("cannot use prefill load scale %q: want auto or a non-negative number", v)
	}
	*f.scale, *f.auto = x, false
	return nil
}
