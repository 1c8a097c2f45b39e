// The page is built into the Python package (src/harness/server/static), committed, so that a user
// installs no Node. File names carry no hashes and the build embeds no time: the same sources build
// the same bytes, which tests/test_server_page_build.py checks against what is committed.
import tailwindcss from "@tailwindcss/vite";
import react from "@vitejs/plugin-react";
import { defineConfig } from "vite";

export default defineConfig({
  plugins: [react(), tailwindcss()],
  base: "/",
  build: {
    outDir: process.env.HARNESS_PAGE_OUT ?? "../src/harness/server/static",
    emptyOutDir: true,
    chunkSizeWarningLimit: 4096,
    rollupOptions: {
      output: {
        entryFileNames: "assets/[name].js",
        chunkFileNames: "assets/[name].js",
        assetFileNames: "assets/[name][extname]",
      },
    },
  },
  server: { proxy: { "/api": "http://127.0.0.1:8000" } },
});
