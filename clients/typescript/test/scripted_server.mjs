// A scripted HTTP server for the shared retry cases
// (clients/testdata/retry_cases.json): each request is answered with the
// next step of a script, and every request is kept for the checks.

import { readFileSync } from "node:fs";
import { createServer } from "node:http";

export const testdata = new URL("../../testdata/", import.meta.url);

export function loadJSON(name) {
  return JSON.parse(readFileSync(new URL(name, testdata), "utf8"));
}

export async function scriptedServer(script, successBody) {
  const steps = [...script];
  const seen = [];
  const server = createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      seen.push({ method: req.method, path: req.url, key: req.headers["idempotency-key"], body, auth: req.headers["authorization"] });
      const step = steps.shift() ?? { status: 500, body: { type: "script-exhausted" } };
      if (step.drop) {
        req.socket.destroy(); // no answer at all
        return;
      }
      if (step.hang) return; // never answered; closed with the server
      let payload = step.body;
      if (payload === undefined && step.status >= 200 && step.status < 300) payload = successBody;
      const raw = payload === undefined ? "" : JSON.stringify(payload);
      res.writeHead(step.status, { "Content-Type": step.content_type ?? "application/json", ...(step.headers ?? {}) });
      res.end(raw);
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    seen,
    async close() {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}
