//! Node-API's link settings for the native module (`napi_build::setup`).

fn main() {
    napi_build::setup();
}
