module chime.test/beevik-ntp

go 1.21

require github.com/beevik/ntp v1.4.3

require (
	golang.org/x/net v0.25.0 // indirect
	golang.org/x/sys v0.20.0 // indirect
)
