//! A generator that returns one word forever, for the decision's unit tests and the
//! `internals` door: all ones draws the top of every range, zero the bottom.

use std::convert::Infallible;

use rand::TryRng;

/// A generator that returns the same word forever: all ones draws the top of every range,
/// zero the bottom.
#[derive(Debug)]
pub(crate) struct ConstRng(pub(crate) u64);

impl TryRng for ConstRng {
    type Error = Infallible;

    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        // Truncation keeps all-ones as all-ones and zero as zero.
        Ok(self.0 as u32)
    }

    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        Ok(self.0)
    }

    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for chunk in dst.chunks_mut(8) {
            let bytes = self.0.to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
        Ok(())
    }
}
