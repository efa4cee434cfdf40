// Package pgcontainer starts a throwaway PostgreSQL with testcontainers-go,
// for tests and `overage dev` on a machine with Docker but no database.
package pgcontainer

import (
	"context"
	"fmt"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Image is the PostgreSQL image started.
const Image = "postgres:15-alpine"

// Start runs PostgreSQL in a container and returns a connection string to
// its database `overage` and a function that removes the container. Any
// error (no Docker engine, no image) is returned as is: the caller says how
// to provide a database instead.
func Start(ctx context.Context) (string, func(context.Context) error, error) {
	c, err := tcpostgres.Run(ctx, Image, tcpostgres.WithDatabase("overage"), tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", nil, fmt.Errorf("start PostgreSQL with testcontainers: %w", err)
	}
	url, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		_ = c.Terminate(ctx)
		return "", nil, fmt.Errorf("PostgreSQL container address: %w", err)
	}
	return url, func(ctx context.Context) error { return c.Terminate(ctx) }, nil
}

// DockerAnswers returns nil when a Docker engine answers testcontainers-go,
// else why not, so a test of the Docker path skips only where no engine
// runs (and never because the path it tests failed).
func DockerAnswers(ctx context.Context) (err error) {
	// testcontainers-go panics on some hosts it cannot read.
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("find a Docker engine: %v", r)
		}
	}()
	p, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return fmt.Errorf("find a Docker engine: %w", err)
	}
	defer p.Close()
	if err := p.Health(ctx); err != nil {
		return fmt.Errorf("ask the Docker engine: %w", err)
	}
	return nil
}
