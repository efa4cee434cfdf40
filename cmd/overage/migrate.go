package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/overage-billing/overage/app"
	"github.com/overage-billing/overage/idempotency"
	"github.com/overage-billing/overage/migrations"
	"github.com/overage-billing/overage/usagelog"
)

func cmdMigrate(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "migrate", "overage migrate [--create-database] [--database-url URL]")
	create := fs.Bool("create-database", false, "create the database DATABASE_URL names if the server does not have it (connecting to the server's postgres database)")
	var db app.DBConfig
	if err := loadConfig(e, fs, args, &db); err != nil {
		return err
	}
	if *create {
		created, err := ensureDatabase(ctx, db.URL)
		if err != nil {
			return err
		}
		if created {
			fmt.Fprintln(e.stdout, "created the database")
		}
	}
	pool, err := app.OpenPool(ctx, db.URL, app.ToolMaxConns)
	if err != nil {
		return err
	}
	defer pool.Close()
	// No logger: a person reads the lines below, one per thing done, not
	// the migrators' JSON.
	res, err := migrations.Migrate(ctx, pool, nil)
	if err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if n := len(res.RiverVersions); n > 0 {
		fmt.Fprintf(e.stdout, "applied River's migrations %03d to %03d\n", res.RiverVersions[0], res.RiverVersions[n-1])
	}
	for _, m := range res.Applied {
		fmt.Fprintf(e.stdout, "applied %04d_%s\n", m.Version, m.Name)
	}
	fmt.Fprintf(e.stdout, "migrations applied: %d river, %d overage\n", len(res.RiverVersions), len(res.Applied))
	// On a new database the first partitions (the tables as they were
	// before partitioning) span months of usage logs and days of
	// idempotency records ahead; while they hold nothing they are ended
	// where the current month and day begin, so each has a partition of
	// its own from the start (idempotency and usagelog FitFirstPartition).
	// The partitions ahead are made with them, so that ingest goes on for
	// months should no `overage work` run (it keeps them hourly).
	fits := []struct {
		fit   func() (bool, []string, error)
		ended string
	}{
		{func() (bool, []string, error) { return idempotency.FitFirstPartition(ctx, pool) }, "ended the empty first idempotency record partition at the current day"},
		{func() (bool, []string, error) { return usagelog.FitFirstPartition(ctx, pool) }, "ended the empty first usage log partition at the current month"},
	}
	for _, f := range fits {
		fitted, created, err := f.fit()
		if err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
		if fitted {
			fmt.Fprintln(e.stdout, f.ended)
		}
		for _, name := range created {
			fmt.Fprintf(e.stdout, "created partition %s\n", name)
		}
	}
	return nil
}

// ensureDatabase creates the database dbURL names if its server answers
// without it, and says whether it did.
func ensureDatabase(ctx context.Context, dbURL string) (bool, error) {
	conn, err := pgx.Connect(ctx, dbURL)
	if err == nil {
		return false, conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != invalidCatalogName {
		return false, err
	}
	if err := createDatabase(ctx, dbURL); err != nil {
		return false, err
	}
	return true, nil
}

// createDatabase creates the database dbURL names, connected to the same
// server's postgres database. One created meanwhile is fine.
func createDatabase(ctx context.Context, dbURL string) error {
	cc, err := pgx.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", app.RedactParseError(err))
	}
	name := cc.Database
	if name == "" || strings.EqualFold(name, "postgres") {
		return fmt.Errorf("DATABASE_URL names no database to create (%q)", name)
	}
	cc.Database = "postgres"
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("connect to create database %q: %w", name, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P04" { // duplicate_database: created meanwhile
			return nil
		}
		return fmt.Errorf("create database %q: %w", name, err)
	}
	return nil
}
