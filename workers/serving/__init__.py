"""What the API processes and the GPU workers share on a request's path: its events, the job a
worker runs, settlement and its outbox, tracing, the model catalog and its versions, the
request path's errors, and the Runtime (every part that differs between the embedded and the
distributed mode, built once at start-up). routing/ and the rest of workers/ sit on this
package; it sits on the engine and on tenants."""
