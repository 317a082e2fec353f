"""`evspark serve`: one loaded model for many clients (engine.py: the decoder loop and its
lanes; app.py: the HTTP endpoints; requests.py: what clients send; metrics.py: what /metrics
shows; client.py: `evs.Client`, the HTTP client)."""
