// Starts the vendored Swagger UI on /docs (a file, not an inline script: the Content-Security-Policy
// allows script files only). The options are FastAPI's defaults for its own /docs page.
window.addEventListener("DOMContentLoaded", function () {
  window.ui = SwaggerUIBundle({
    url: document.getElementById("swagger-ui").dataset.openapi,
    dom_id: "#swagger-ui",
    layout: "BaseLayout",
    deepLinking: true,
    showExtensions: true,
    showCommonExtensions: true,
    presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
  });
});
