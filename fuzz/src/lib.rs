//! What the fuzz targets share.

use std::sync::OnceLock;

/// One current-thread runtime per fuzzing process, for the targets that drive async code
/// (a runtime per input would cost more than the input).
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime")
    })
}
