package main

import "testing"

func TestOnlyTest(t *testing.T) { onlyTest() }
