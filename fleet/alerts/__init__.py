"""Alerts: raising one and delivering it to every webhook endpoint that wants it (`notify`), the Standard Webhooks
signing and sending (`webhooks`), and the Alerts page (`views`)."""
