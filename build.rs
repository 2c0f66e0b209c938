//! Marks a build with no PostgreSQL server to test against (`IDEMPOTENT_RETRY_PG_URL` unset,
//! outside CI), so that its PostgreSQL tests are reported as ignored, with the reason, instead
//! of passing without running. The library itself reads nothing of this.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(no_postgres_server)");
    println!("cargo::rerun-if-env-changed=IDEMPOTENT_RETRY_PG_URL");
    println!("cargo::rerun-if-env-changed=CI");
    if std::env::var_os("IDEMPOTENT_RETRY_PG_URL").is_none() && std::env::var_os("CI").is_none() {
        println!("cargo::rustc-cfg=no_postgres_server");
    }
}
