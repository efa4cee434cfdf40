// Package stripeclient is the project's only seam over stripe-go for sending
// usage to Stripe as Billing Meter Events.
//
// The design behind it is in docs/stripeclient.md.
package stripeclient
