module github.com/spillway-go/spillway/loadtest

go 1.26.8

require github.com/spillway-go/spillway v0.0.0

replace github.com/spillway-go/spillway => ../
