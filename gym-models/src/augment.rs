//! Random affine augmentation of images (torchvision's `RandomAffine(degrees, translate)`,
//! as the original's MNIST run uses), drawn from the node's own random stream.
//!
//! It is a layer at the model's entry rather than a dataset transform: in training a model
//! runs on autodiff tensors and each call draws new transforms from the node's stream
//! ([`gym_core::rng`]), so every pass over the data sees new transforms and a run is
//! reproducible from its seed whatever the thread timing; in evaluation it is the identity.

use burn::config::Config;
use burn::module::Module;
use burn::tensor::{Tensor, TensorData};
use rand::Rng;

/// Settings of [`RandomAffine`].
#[derive(Config, Debug)]
pub struct RandomAffineConfig {
    /// Rotation angles are drawn uniformly from `[-degrees, degrees]`.
    #[config(default = 10.0)]
    pub degrees: f64,
    /// Shifts are drawn uniformly from `[-translate · width, translate · width]` (and the
    /// same for the height), rounded to whole pixels as torchvision does.
    #[config(default = 0.1)]
    pub translate: f64,
    /// The value of pixels that come from outside the image (the normalised black of MNIST
    /// for an input normalised as the original does: `(0 − 0.1307) / 0.3081`).
    #[config(default = "-0.424_212_9")]
    pub fill: f64,
}

impl RandomAffineConfig {
    /// The layer.
    pub fn init(&self) -> RandomAffine {
        RandomAffine {
            degrees: self.degrees,
            translate: self.translate,
            fill: self.fill,
        }
    }
}

/// Rotates each image about its centre and shifts it by whole pixels, with nearest-neighbour
/// sampling (torchvision's default), in training; the identity in evaluation.
#[derive(Module, Debug)]
pub struct RandomAffine {
    /// Largest rotation, in degrees.
    pub degrees: f64,
    /// Largest shift, as a fraction of the image's side.
    pub translate: f64,
    /// Value of pixels from outside the image.
    pub fill: f64,
}

/// One image's transform: rotation in radians, shift in pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Affine {
    /// Counter-clockwise rotation, in radians.
    pub angle: f64,
    /// Shift to the right, in pixels.
    pub dx: f64,
    /// Shift down, in pixels.
    pub dy: f64,
}

impl RandomAffine {
    /// `images` (`[batch, channels, height, width]`) transformed, each with its own draw.
    pub fn forward(&self, images: Tensor<4>) -> Tensor<4> {
        if !images.is_autodiff() || (self.degrees == 0.0 && self.translate == 0.0) {
            return images;
        }
        let [b, c, h, w] = images.dims();
        let transforms: Vec<Affine> = gym_core::rng::with_node_rng(|rng| {
            (0..b)
                .map(|_| {
                    let angle = rng.random_range(-self.degrees..=self.degrees).to_radians();
                    let (max_dx, max_dy) = (self.translate * w as f64, self.translate * h as f64);
                    let dx = rng.random_range(-max_dx..=max_dx).round();
                    let dy = rng.random_range(-max_dy..=max_dy).round();
                    Affine { angle, dx, dy }
                })
                .collect()
        });
        let device = images.device();
        let dtype = images.dtype();
        let pixels: Vec<f32> = images
            .into_data()
            .convert::<f32>()
            .try_into_vec::<f32>()
            .expect("float images");
        let mut out = vec![0.0f32; pixels.len()];
        let plane = h * w;
        for (i, t) in transforms.iter().enumerate() {
            for ch in 0..c {
                let start = (i * c + ch) * plane;
                warp(
                    &pixels[start..start + plane],
                    &mut out[start..start + plane],
                    [h, w],
                    *t,
                    self.fill as f32,
                );
            }
        }
        Tensor::<4>::from_data(
            TensorData::new(out, [b, c, h, w]).convert_dtype(dtype),
            &device,
        )
    }
}

/// `dst` = `src` (an `h × w` plane) rotated by `t.angle` about its centre, then shifted by
/// `(t.dx, t.dy)`: each output pixel takes the source pixel nearest to its inverse image,
/// `fill` where that falls outside.
pub fn warp(src: &[f32], dst: &mut [f32], [h, w]: [usize; 2], t: Affine, fill: f32) {
    let (cx, cy) = ((w as f64 - 1.0) / 2.0, (h as f64 - 1.0) / 2.0);
    let (sin, cos) = t.angle.sin_cos();
    for y in 0..h {
        for x in 0..w {
            // Undo the shift, then the rotation (the inverse of a rotation is its transpose).
            let (u, v) = (x as f64 - t.dx - cx, y as f64 - t.dy - cy);
            let (sx, sy) = (cos * u + sin * v + cx, -sin * u + cos * v + cy);
            let (sx, sy) = (sx.round(), sy.round());
            dst[y * w + x] = if sx >= 0.0 && sy >= 0.0 && sx < w as f64 && sy < h as f64 {
                src[sy as usize * w + sx as usize]
            } else {
                fill
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plane(h: usize, w: usize) -> Vec<f32> {
        (0..h * w).map(|i| i as f32).collect()
    }

    #[test]
    fn a_shift_moves_every_pixel_by_whole_pixels() {
        let src = plane(5, 6);
        let mut dst = vec![0.0; 30];
        let t = Affine {
            angle: 0.0,
            dx: 2.0,
            dy: -1.0,
        };
        warp(&src, &mut dst, [5, 6], t, -1.0);
        for y in 0..5 {
            for x in 0..6 {
                let (sx, sy) = (x as i64 - 2, y as i64 + 1);
                let want = if (0..6).contains(&sx) && (0..5).contains(&sy) {
                    src[sy as usize * 6 + sx as usize]
                } else {
                    -1.0
                };
                assert_eq!(dst[y * 6 + x], want, "({x}, {y})");
            }
        }
    }

    #[test]
    fn quarter_and_half_turns_permute_the_pixels() {
        // On a square, a quarter turn about the centre maps pixel (x, y) to (y, n−1−x) or
        // its mirror: every value survives, none is filled.
        let n = 5;
        let src = plane(n, n);
        let mut quarter = vec![0.0; n * n];
        let turn = |angle| Affine {
            angle,
            dx: 0.0,
            dy: 0.0,
        };
        warp(
            &src,
            &mut quarter,
            [n, n],
            turn(std::f64::consts::FRAC_PI_2),
            -1.0,
        );
        let mut sorted = quarter.clone();
        sorted.sort_by(f32::total_cmp);
        assert_eq!(sorted, src);
        // Two quarter turns are a half turn: the reversed plane.
        let mut half = vec![0.0; n * n];
        warp(&src, &mut half, [n, n], turn(std::f64::consts::PI), -1.0);
        let reversed: Vec<f32> = src.iter().rev().copied().collect();
        assert_eq!(half, reversed);
        let mut twice = vec![0.0; n * n];
        warp(
            &quarter,
            &mut twice,
            [n, n],
            turn(std::f64::consts::FRAC_PI_2),
            -1.0,
        );
        assert_eq!(twice, reversed);
    }

    #[test]
    fn evaluation_is_the_identity() {
        let device = burn::tensor::Device::default();
        let images = Tensor::<4>::ones([2, 1, 4, 4], &device);
        let out = RandomAffineConfig::new().init().forward(images.clone());
        assert_eq!(out.into_data(), images.into_data());
    }
}
