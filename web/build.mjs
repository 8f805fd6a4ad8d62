// Bundles the settings page into dist/ (what the server's HTTP port serves at /).
// The page imports the generated stubs (../generated/ts) and the shared character counting
// (../clients/ts/src/charcount.ts) in place, so there is one copy of each; their bare imports
// (@bufbuild/protobuf) resolve from this folder's node_modules (nodePaths).
import { build } from "esbuild";
import { copyFileSync, mkdirSync, rmSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const out = join(here, "dist");
rmSync(out, { recursive: true, force: true });
mkdirSync(out);
await build({
  entryPoints: [join(here, "src", "main.ts")],
  bundle: true,
  format: "esm",
  target: "es2022",
  minify: true,
  sourcemap: true,
  outfile: join(out, "app.js"),
  nodePaths: [join(here, "node_modules")],
  logLevel: "warning",
});
for (const file of ["index.html", "style.css"]) {
  copyFileSync(join(here, file), join(out, file));
}
